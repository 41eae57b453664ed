"""What a new user hit, as they hit it: the real command, its one line of error or its exit on
Ctrl-C (SIGINT to the real process: one line on stderr, exit 130, no child left)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.integration.test_processes import free_port

pytestmark = pytest.mark.integration
CLI = [sys.executable, "-m", "rocev2_emu"]
ENV = {**os.environ, "PYTHONUNBUFFERED": "1"}


def run(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=timeout, env=ENV)


def children(pid: int) -> set[int]:
    """The processes whose parent is ``pid`` (from /proc)."""
    out = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                status = (entry / "status").read_text()
            except OSError:
                continue
            if f"\nPPid:\t{pid}\n" in status:
                out.add(int(entry.name))
    return out


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0]
    except (OSError, IndexError):
        return False
    return state != "Z"


@contextmanager
def fabric(topo: Path, env: dict[str, str] = ENV) -> Iterator[subprocess.Popen[str]]:
    """``rocev2-emu up TOPO`` running until the block ends (then Ctrl-C, or kill on failure)."""
    proc = subprocess.Popen(
        [*CLI, "up", str(topo)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            if "Ctrl-C stops the fabric" in line:
                break
        else:  # it ended before it was up: say why
            proc.wait(timeout=60)
            assert proc.stderr is not None
            raise AssertionError(f"up ended with code {proc.returncode}: {proc.stderr.read()}")
        yield proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.communicate()
        for stream in (proc.stdout, proc.stderr):  # what the block did not read
            if stream is not None and not stream.closed:
                stream.close()


def interrupt_after(proc: subprocess.Popen[str], ready: str) -> tuple[str, str]:
    """Wait for ``ready`` on the process's stdout, send SIGINT, collect the rest."""
    assert proc.stdout is not None
    seen = []
    for line in proc.stdout:
        seen.append(line)
        if ready in line:
            break
    else:
        pytest.fail(f"never printed {ready!r}: {''.join(seen)} {proc.communicate()[1]}")
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    return "".join(seen) + out, err


@pytest.fixture
def topo(tmp_path: Path) -> Path:
    path = tmp_path / "two.toml"
    path.write_text(run("topology", "single-switch", "--hosts", "2", "--tdf", "2000").stdout)
    return path


@pytest.mark.parametrize(
    "command",
    [
        ["bench", "all-reduce", "--virtual", "-b", "4M", "-e", "4M", "-n", "50"],
        ["scenario", "incast", "--virtual"],
    ],
)
def test_ctrl_c_in_a_virtual_run_is_one_line_and_exit_130(
    command: list[str], tmp_path: Path
) -> None:
    proc = subprocess.Popen(
        [*CLI, *command],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=ENV,
        cwd=tmp_path,
    )
    _, err = interrupt_after(proc, "# ")
    assert proc.returncode == 130
    assert err.strip().splitlines() == [f"rocev2-emu {command[0]}: interrupted"], err


def test_ctrl_c_stops_a_running_fabric_and_leaves_no_node_behind(topo: Path) -> None:
    with fabric(topo) as proc:
        nodes = children(proc.pid)
        assert len(nodes) == 3  # a switch and two hosts
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130
    said = [line for line in err.strip().splitlines() if not line.startswith("# ")]  # (its block)
    assert said == ["rocev2-emu up: stopped"], err
    assert not [pid for pid in nodes if alive(pid)]


def test_stopping_one_node_leaves_the_rest_of_the_fabric_running(topo: Path) -> None:
    with fabric(topo) as proc:
        assert proc.stderr is not None
        assert run("stop", str(topo), "h1").returncode == 0
        said = proc.stderr.readline()
        while said.startswith("# "):  # the block it took, when another fabric runs on 127.10
            said = proc.stderr.readline()
        assert "node h1 stopped; the rest of the fabric runs on" in said
        assert proc.poll() is None  # up is still running
        assert run("stop", str(topo), "h0").returncode == 0  # and h0 still answers
    assert proc.returncode == 130  # Ctrl-C at the end, as a user would


def test_a_client_with_no_server_fails_at_once() -> None:
    port = str(free_port())
    # a generous connect timeout: the command must not wait for it to see that nothing listens
    out = run("write-bw", "127.0.0.1", "-p", port, "--connect-timeout", "600", timeout=60)
    assert out.returncode == 1
    assert "connection refused by 127.0.0.1:" in out.stderr
    out = run("write-bw", "localhots", "--connect-timeout", "600", timeout=60)
    assert out.returncode == 1 and "cannot resolve 'localhots'" in out.stderr


def test_a_client_talking_to_something_else_says_so() -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()

    def http_server() -> None:
        conn, _ = listener.accept()
        with conn:
            conn.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n")
            conn.recv(65536)

    thread = threading.Thread(target=http_server, daemon=True)
    thread.start()
    try:
        port = str(listener.getsockname()[1])
        out = run("write-bw", "127.0.0.1", "-p", port, "--nic-addr", "127.0.0.47")
    finally:
        listener.close()
    assert out.returncode == 1
    assert "is not a rocev2-emu peer" in out.stderr and "HTTP" in out.stderr


def test_client_and_server_at_different_tdfs_are_refused() -> None:
    from rocev2_emu.tools.perftest import wait_until_listening

    port = str(free_port())
    with subprocess.Popen(  # its pipes closed and it reaped however the test ends
        [*CLI, "write-bw", "-p", port, "--tdf", "200", "--nic-addr", "127.0.0.48"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=ENV,
    ) as server:
        try:
            wait_until_listening(server)
            client = run(
                "write-bw", "127.0.0.1", "-p", port, "--tdf", "2000", "--nic-addr", "127.0.0.49"
            )
            _, server_err = server.communicate(timeout=60)
        finally:
            if server.poll() is None:
                server.kill()
    assert client.returncode == 1 and server.returncode == 1
    for err in (client.stderr, server_err):
        assert "TDF is 2000.0, this server's 200.0" in err, err


@pytest.mark.parametrize(
    ("args", "code", "says"),
    [
        (["write-bw", "-s", "-5", "127.0.0.1"], 2, "argument -s/--size: -5 must be at least 1"),
        (["write-bw", "--rate", "-1", "127.0.0.1"], 2, "argument --rate: -1 must be >= 0"),
        (["write-bw", "--tdf", "nan", "127.0.0.1"], 2, "'nan' is not a finite number"),
        (["bench", "all-reduce", "-b", "4M", "-e", "1M"], 1, "-b 4194304 is larger than -e"),
    ],
)
def test_bad_values_are_one_line_not_a_traceback(args: list[str], code: int, says: str) -> None:
    out = run(*args)
    assert out.returncode == code and says in out.stderr, out.stderr
    assert "Traceback" not in out.stderr


def test_a_missing_node_is_one_line(topo: Path) -> None:
    out = run("node", str(topo), "h9")
    assert out.returncode == 1
    assert out.stderr.strip().splitlines() == [
        f"rocev2-emu node: error: {topo}: no node named 'h9'"
    ], out.stderr


def test_familiar_perftest_and_nccl_tests_flags_are_accepted(topo: Path) -> None:
    out = run("write-bw", "-d", "mlx5_0", "-x", "3", "-F", "-R", "localhots")
    assert "--ib-dev, --gid-index, --CPU-freq, --rdma-cm accepted and ignored" in out.stderr
    assert "cannot resolve 'localhots'" in out.stderr  # -d took the device, not the server
    out = run(
        "bench",
        "all-reduce",
        "--virtual",
        "--topology",
        str(topo),
        "-b",
        "8",
        "-e",
        "8",
        "-n",
        "1",
        "-w",
        "0",
        "-g",
        "1",
        "-t",
        "1",
        "-z",
        "0",
    )
    assert out.returncode == 0, out.stderr
    assert "--ngpus, --nthreads, --blocking accepted and ignored" in out.stderr


def test_a_mistyped_flag_shows_the_subcommands_usage(topo: Path) -> None:
    out = run("up", str(topo), "--virtuall")
    assert out.returncode == 2
    assert out.stderr.startswith("usage: rocev2-emu up ")
    assert "unrecognized arguments: --virtuall" in out.stderr


def test_unknown_scenario_lists_every_scenario_with_the_plugins() -> None:
    out = run("scenario", "incats", "--virtual")
    assert out.returncode == 2
    assert "straggler" in out.stderr and "incast" in out.stderr


@pytest.mark.parametrize(
    "shape",
    [
        ["single-switch", "--hosts", "3", "--tdf", "700"],
        ["leaf-spine", "--spines", "3", "--leaves", "2", "--rate", "400"],
        ["fat-tree", "-k", "4", "--delay-us", "2.5"],
    ],
)
def test_a_generated_topology_names_the_command_that_writes_it_again(shape: list[str]) -> None:
    text = run("topology", *shape).stdout
    first = text.splitlines()[0]
    assert first.startswith("# generated by: rocev2-emu topology ")
    again = run(*first.removeprefix("# generated by: rocev2-emu ").split()).stdout
    assert again == text


def test_an_attached_bench_without_the_fabrics_file_says_so() -> None:
    out = run("bench", "all-reduce", "--attach")
    assert out.returncode != 0 and "--attach needs --topology FILE" in out.stderr


@pytest.mark.timeout(600)
def test_an_attached_bench_reports_its_own_run_not_the_fabrics_past(topo: Path) -> None:
    bench = ["bench", "all-reduce", "--attach", "--topology", str(topo), "-b", "64K", "-e", "64K"]
    with fabric(topo):
        assert run("link", str(topo), "h0", "sw0", "--loss", "0.05").returncode == 0
        lossy = run(*bench, "-n", "3", "-w", "0", timeout=300)
        assert lossy.returncode == 0, lossy.stderr
        assert run("link", str(topo), "h0", "sw0", "--loss", "0").returncode == 0
        clean = run(*bench, "-n", "1", "-w", "0", timeout=300)
        assert clean.returncode == 0, clean.stderr

    def retransmitted(out: str) -> int:
        line = next(x for x in out.splitlines() if "retransmitted packets" in x)
        return int(line.split("retransmitted packets ")[1].split(",")[0])

    assert retransmitted(lossy.stdout) > 0
    assert retransmitted(clean.stdout) == 0  # the lossy run's retransmits are not this job's
    assert "late wake-ups" in clean.stdout
