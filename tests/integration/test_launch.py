"""``rocev2-emu launch`` with a program that is not PyTorch: the environment each rank gets, the
rank prefix on its output, the first failing rank's exit code, and the refused command lines;
``launch --host`` (one rank per launcher, over a switch already running) and
``--nproc-per-host`` (a NIC per local rank), each with a real all-reduce."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from collectives.launcher import per_host
from rocev2_emu.cli import main
from rocev2_emu.control import auth
from rocev2_emu.topology.file import load
from rocev2_emu.topology.generate import single_switch
from rocev2_emu.verbs import FABRIC_SECRET_ENV

pytestmark = pytest.mark.integration

SHOW = (
    "import os, sys; e = os.environ; "
    "print(e['RANK'], e['WORLD_SIZE'], e['LOCAL_RANK'], e['LOCAL_WORLD_SIZE'], e['ROCEV2_HOST'], "
    "e['MASTER_ADDR'], e['MASTER_PORT'].isdigit(), e['ROCEV2_STORE'].startswith('127.0.0.1:'), "
    "len(e['ROCEV2_EMU_SECRET']), e['OMP_NUM_THREADS']); "
    "sys.exit(3 if e['RANK'] == '1' else 0)"
)


def _needs_torch() -> None:
    if os.environ.get("CI") == "true":
        import torch  # noqa: F401 - CI installs the torch extra: its absence is a failure
    else:
        pytest.importorskip("torch", reason="pip install -e '.[torch]'")


def _launch(command: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "rocev2_emu", *command],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.fixture
def topology(tmp_path: Path) -> Path:
    path = tmp_path / "three.toml"
    path.write_text(single_switch(3, tdf=1000))
    return path


def test_each_rank_gets_torchruns_environment_and_the_first_failure_is_the_exit_code(
    topology: Path,
) -> None:
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "rocev2_emu",
            "launch",
            str(topology),
            "--clock",
            "wall",
            "--",
            sys.executable,
            "-c",
            SHOW,
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 3, run.stdout + run.stderr
    lines = sorted(line for line in run.stdout.splitlines() if line.startswith("[rank"))
    assert [line.split()[:6] for line in lines] == [
        [f"[rank{r}]:", str(r), "3", "0", "1", f"h{r}"] for r in range(3)
    ]
    assert all(line.split()[6:] == ["127.0.0.1", "True", "True", "64", "1"] for line in lines)
    assert "rank 1 (h1) exited with code 3" in run.stderr
    assert "# fabric: 0 pause frames" in run.stdout  # the switches' summary at the end
    assert "late wake-ups; clock: wall, TDF" in run.stdout


def test_refused_command_lines(topology: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["launch", str(topology)]) == 1
    assert "no command; give it after --" in capsys.readouterr().err
    assert main(["launch", str(topology), "--ranks", "4", "--", "true"]) == 1
    assert "--ranks 4: from 1 to the topology's 3 hosts" in capsys.readouterr().err
    assert main(["demo", "--perftest", "--ui"]) == 1  # the map draws a fabric; perftest has none
    assert "--perftest has none" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # only launch takes a program after --
        main(["topology", "single-switch", "--hosts", "2", "--", "true"])
    assert "unrecognized arguments: -- true" in capsys.readouterr().err


ALL_REDUCE = (
    "import torch, torch.distributed as dist; dist.init_process_group('rocev2'); "
    "r = dist.get_rank(); t = torch.full((1031,), float(r + 1)); dist.all_reduce(t); "
    "print('sum', r, dist.get_world_size(), int(t[0]), bool((t == t[0]).all())); "
    "dist.destroy_process_group()"
)


def test_one_rank_per_launcher_over_switches_already_running(topology: Path) -> None:
    """``launch --host``, as the compose testbed's training service runs it (a container per
    host): the switch is a node of its own, each host's launcher runs that host's rank, the
    first host's serves the rendezvous; a real all-reduce crosses the fabric."""
    _needs_torch()
    topo = load(str(topology))
    env = {**os.environ, FABRIC_SECRET_ENV: auth.new().hex()}
    switch = subprocess.Popen(
        [sys.executable, "-m", "rocev2_emu", "node", str(topology), "sw0"],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    ranks: list[subprocess.Popen[str]] = []
    try:
        assert switch.stdout is not None
        assert switch.stdout.readline().startswith("READY sw0")  # its deadline: the timeout
        for host in ("h2", "h0", "h1"):  # the store's host need not start first
            command = ["launch", str(topology), "--host", host, "--job", "t1", "--clock", "wall"]
            command += ["--"]
            ranks.append(
                subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "rocev2_emu",
                        *command,
                        sys.executable,
                        "-c",
                        ALL_REDUCE,
                    ],
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    text=True,
                    env=env,
                )
            )
        outs = [p.communicate(timeout=300)[0] for p in ranks]
        assert [p.returncode for p in ranks] == [0, 0, 0], "\n".join(outs)
        for out, host in zip(outs, ("h2", "h0", "h1"), strict=True):
            rank = int(host[1:])
            assert f"[rank{rank}]: sum {rank} 3 6 True" in out, out
        assert topo.nodes["h0"].address != "127.0.0.1"  # the store lived on h0's own address
    finally:
        for p in [*ranks, switch]:
            if p.poll() is None:
                p.kill()
            p.wait()
            if p.stdout is not None:
                p.stdout.close()


def test_nproc_per_host_gives_each_local_rank_its_own_nic(tmp_path: Path) -> None:
    """``--nproc-per-host 2`` on two hosts: four ranks, each with its own NIC (h0-0, h0-1,
    h1-0, h1-1 on the switch), torchrun's local and group ranks, and a real all-reduce."""
    _needs_torch()
    path = tmp_path / "two.toml"
    path.write_text(single_switch(2, tdf=1000))
    program = (
        "import os; e = os.environ; "
        "print('env', e['ROCEV2_HOST'], e['LOCAL_RANK'], e['LOCAL_WORLD_SIZE'], "
        "e['GROUP_RANK'], e['GROUP_WORLD_SIZE']); " + ALL_REDUCE
    )
    command = ["launch", str(path), "--clock", "wall", "--nproc-per-host", "2", "--"]
    command += [sys.executable, "-c", program]
    run = _launch(command, timeout=300)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "# rocev2-emu launch: 4 ranks" in run.stdout
    for rank, (host, local) in enumerate([("h0", 0), ("h0", 1), ("h1", 0), ("h1", 1)]):
        assert f"[rank{rank}]: env {host}-{local} {local} 2 {rank // 2} 2" in run.stdout
        assert f"[rank{rank}]: sum {rank} 4 10 True" in run.stdout


def test_per_host_copies_each_hosts_links() -> None:
    data = tomllib.loads(single_switch(2))
    wide = per_host(data, 3)
    assert [h["name"] for h in wide["host"]] == [f"h{k}-{i}" for k in (0, 1) for i in range(3)]
    ends = sorted((lk["a"], lk["b"]) for lk in wide["link"])
    assert ends == sorted((f"h{k}-{i}", "sw0") for k in (0, 1) for i in range(3))
    assert per_host(data, 1) is data
    with pytest.raises(ValueError, match="at least 1"):
        per_host(data, 0)


LAST_WORDS = (
    "import torch, torch.distributed as dist; dist.init_process_group('rocev2'); "
    "t = torch.ones(1)\n"
    "for _ in range(4): dist.all_reduce(t)\n"
    "print('value', dist.get_rank(), int(t[0])); dist.destroy_process_group()"
)


@pytest.mark.timeout(900)
def test_a_rank_that_closes_first_answers_the_others_last_writes(tmp_path: Path) -> None:
    """On the wall clock a rank whose last all-reduce is over closes while a peer still waits
    for the ACK of its last write (a one-frame write: its ACK leaves a dilated instant later);
    the NIC answers until every rank has closed, so no write ends in RETRY_EXC_ERR (#59)."""
    _needs_torch()
    path = tmp_path / "four.toml"
    path.write_text(single_switch(4, tdf=5000))
    command = ["launch", str(path), "--clock", "wall", "--", sys.executable, "-c", LAST_WORDS]
    run = _launch(command, timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    for rank in range(4):
        assert f"[rank{rank}]: value {rank} 256" in run.stdout
    assert "0 retransmissions" in run.stdout
