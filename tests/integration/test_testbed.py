"""The docker-compose testbed for real: on the exact clock (docker-compose.yml), the job's
figures equal the virtual run's beside CPU burners, Prometheus scraping the run; on the wall
clock (docker-compose.wall.yml), the all-reduce job, a link taken down mid-run, and the
testbed's own Prometheus (built by compose from Debian's package, no image registry) scraping
every node for the dashboards; the training testbed (docker-compose.training.yml), DDP on the
exact clock, the same emulated figures on a second run beside CPU burners.

Needs a Docker engine, docker-compose and a base image (``.ci/run`` installs and builds them;
``ROCEV2_BASE_IMAGE`` names the base image, else the public slim Python image).
Under CI=true a missing part fails the test; elsewhere it skips, saying what to install.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from rocev2_emu.control import auth
from rocev2_emu.testbed import dashboards
from rocev2_emu.testbed.compose import TRAIN_STEPS
from rocev2_emu.topology.file import load
from rocev2_emu.topology.processes import process_groups
from tests.conftest import require_tool
from tests.integration.test_exact import cpu_burners

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
PROJECT = "rocev2ci"
JOB = ["bench", "all-reduce", "--attach", "--topology", "/etc/rocev2-emu/topology.toml"]
JOB += ["-b", "8", "-e", "256K", "-f", "8", "-n", "3", "-w", "1"]
SIZES = [8, 64, 512, 4096, 32768, 262144]
EXACT_ABSENT: tuple[str, ...] = ()  # dashboard series an exact run does not have


def _missing(what: str) -> None:
    message = f"{what}: install Debian's docker.io, docker-compose and prometheus (see .ci/run)"
    if os.environ.get("CI") == "true":
        pytest.fail(message, pytrace=False)
    pytest.skip(message)


def _run(*argv: str, timeout: float = 300, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        list(argv), cwd=ROOT, capture_output=True, text=True, timeout=timeout, check=check
    )


def _compose(
    *argv: str, timeout: float = 300, check: bool = True
) -> subprocess.CompletedProcess[str]:
    return _run("docker-compose", "-p", PROJECT, *argv, timeout=timeout, check=check)


def _wall(*argv: str, timeout: float = 300, check: bool = True) -> subprocess.CompletedProcess[str]:
    """docker-compose on the wall-clock testbed (the same project, services and Prometheus)."""
    return _compose("-f", "docker-compose.wall.yml", *argv, timeout=timeout, check=check)


@pytest.fixture(scope="module", autouse=True)
def testbed_secret() -> Iterator[bytes]:
    """deploy/fabric.secret, as ``rocev2-emu compose`` makes it (kept if there is one): the
    testbed's secret service copies it for the containers, the host's ``rocev2-emu link``
    finds it beside the topology."""
    path = ROOT / "deploy" / auth.BESIDE_TOPOLOGY
    made = not path.exists()
    if made:
        auth.write(path, auth.new(), exclusive=True)
    try:
        yield auth.read(path)
    finally:
        if made:
            path.unlink(missing_ok=True)


@pytest.fixture(scope="module")
def image() -> str:
    require_tool("docker", "Debian's docker.io")
    require_tool("docker-compose", "Debian's docker-compose")
    if _run("docker", "info", check=False).returncode:
        _missing("no Docker engine answers (start dockerd)")
    base = os.environ.get("ROCEV2_BASE_IMAGE", "python:3.11-slim")
    build = _run(
        "docker",
        "build",
        "-q",
        "-t",
        "rocev2-emu:latest",
        "--build-arg",
        f"BASE_IMAGE={base}",
        ".",
        timeout=600,
        check=False,
    )
    assert build.returncode == 0, build.stdout[-2000:] + build.stderr[-2000:]
    return "rocev2-emu:latest"


@pytest.mark.timeout(900)  # the first test of the module builds the image (compiles the cores)
def test_the_image_runs_the_compiled_cores(image: str) -> None:
    version = _run("docker", "run", "--rm", image, "--version", timeout=120)
    assert "cores: compiled (mypyc " in version.stdout, version.stdout + version.stderr


@pytest.fixture
def prometheus(image: str) -> Iterator[str]:
    """The testbed's own Prometheus service, built by compose from Debian's package on the
    local base (no registry), scraping every node with the generated config."""
    build = _compose("build", "prometheus", timeout=900, check=False)
    assert build.returncode == 0, build.stdout[-2000:] + build.stderr[-2000:]
    _compose("up", "-d", "prometheus")
    url = "http://127.0.0.1:9090"
    try:
        _wait_ready(url)
        yield url
    finally:
        _compose("down", "-v", "--remove-orphans", timeout=120, check=False)


def _wait_ready(url: str, timeout: float = 60) -> None:
    """Until the Prometheus at ``url`` says it is ready (within ``timeout`` seconds)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            urllib.request.urlopen(f"{url}/-/ready", timeout=2)
            return
        except OSError:
            assert time.monotonic() < deadline, f"prometheus did not become ready in {timeout} s"
            time.sleep(0.3)


def _query(url: str, path: str, **params: Any) -> list[dict[str, Any]]:
    q = urllib.parse.urlencode(params)
    with urllib.request.urlopen(f"{url}/api/v1/{path}?{q}", timeout=10) as resp:
        body = json.load(resp)
    assert body["status"] == "success", body
    return list(body["data"]["result"])


def _wait_healthy(
    names: list[str],
    timeout: float = 120,
    compose: Callable[..., subprocess.CompletedProcess[str]] = _compose,
) -> None:
    """Wait until the containers of ``names`` (of ``compose``'s project) report healthy."""
    deadline = time.monotonic() + timeout
    while True:
        ps = compose("ps", "-q", *names).stdout.split()
        states = [
            _run("docker", "inspect", "-f", "{{.State.Health.Status}}", cid).stdout.strip()
            for cid in ps
        ]
        if len(states) == len(names) and all(s == "healthy" for s in states):
            return
        assert time.monotonic() < deadline, f"not healthy within {timeout:g} s: {states}"
        time.sleep(1)


# a compose job, a link failure and a Prometheus query per dashboard panel: about two minutes
# on a quiet machine, so past the default per-test timeout on a busy one (a hang still ends it)
@pytest.mark.timeout(600)
def test_wall_testbed_job_link_down_and_prometheus(image: str, prometheus: str) -> None:
    topo = load(ROOT / "deploy" / "topology.toml")
    names = list(topo.nodes)
    link = [sys.executable, "-m", "rocev2_emu", "link", "deploy/topology.toml", "leaf0", "spine0"]
    try:
        _wall("up", "-d", *names)
        _wait_healthy(names, compose=_wall)
        started = time.time()
        outcome: dict[str, subprocess.CompletedProcess[str]] = {}

        def job() -> None:
            outcome["job"] = _wall("run", "--rm", "job", *JOB, timeout=400, check=False)

        runner = threading.Thread(target=job)
        runner.start()
        time.sleep(8)  # the job is connected and running: take a spine link away
        down = _run(*link, "down")
        assert "is down" in down.stdout
        runner.join(420)
        result = outcome["job"]
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
        assert "# Out of bounds values : 0 OK" in result.stdout  # ECMP rerouted, all correct
        rows = [line.split() for line in result.stdout.splitlines() if line[:1] == " "]
        assert [int(r[0]) for r in rows] == SIZES
        _run(*link, "up")
        time.sleep(5)  # two more scrapes after the job

        # every expression of every provisioned dashboard returns data for the run's window
        gaps = _dashboard_gaps(prometheus, started)
        assert not gaps, gaps
        # and some are the values the run is known to have produced
        moved = _query(prometheus, "query", query='rocev2_collective_bytes_total{op="all_reduce"}')
        per_rank = {r["metric"]["rank"]: float(r["value"][1]) for r in moved}
        assert per_rank == {str(r): sum(SIZES) * 2 * (1 + 3) for r in range(8)}
        down_drops = _query(
            prometheus,
            "query",
            query='sum(rocev2_switch_dropped_packets_total{reason="link_down"}) >= 0',
        )
        assert down_drops
        tdf = _query(prometheus, "query", query="max(rocev2_emulation_tdf)")
        assert float(tdf[0]["value"][1]) == topo.tdf
        # batched I/O across the bridge: every node says its mode, and the kernel's GSO/GRO
        # worked between containers (a refused GSO send would have dropped a node to "gro")
        batch = _query(prometheus, "query", query="rocev2_batch_io == 1")
        modes = {r["metric"]["node"]: r["metric"]["mode"] for r in batch}
        assert set(modes) == set(names), modes
        assert set(modes.values()) == {"gso+gro"}, modes
    finally:
        _compose("down", "-v", "--remove-orphans", timeout=120, check=False)


def _dashboard_gaps(prometheus: str, started: float, skip: tuple[str, ...] = ()) -> list[str]:
    """The expressions of the provisioned dashboards that return no data for the window from
    ``started`` to now (a PyTorch job's series left out: test_torch.py scrapes those)."""
    empty = []
    for name in ("fabric", "transport", "collectives"):
        text = (ROOT / "deploy" / "grafana" / "dashboards" / f"{name}.json").read_text()
        for expr in dashboards.expressions(text):
            if dashboards.TRAINING_ONLY in expr or any(s in expr for s in skip):
                continue
            got = _query(
                prometheus, "query_range", query=expr, start=started, end=time.time(), step=1
            )
            if not got:
                empty.append(f"{name}: {expr}")
    return empty


def _job_argv(text: str) -> list[str]:
    """The command of the ``job`` service of a compose or stack file's text."""
    command = re.search(r"\n  job:\n    image: \S+\n    command: (\[.*\])\n", text)
    assert command is not None
    return list(json.loads(command.group(1)))


# the testbed's own job (1 KiB - 4 MiB, 5 iterations) on 14 exact containers beside two CPU
# burners, and the same benchmark in virtual time: a few minutes on a busy machine
@pytest.mark.timeout(900)
def test_exact_testbed_job_prints_the_virtual_figures(image: str, prometheus: str) -> None:
    """docker-compose.yml as it is: every node a container on the exact clock, joining the
    coordinator its job serves - the job's table and fabric summary are the virtual run's,
    line for line, while two processes burn the CPUs; the nodes end with the job (exit 0);
    Prometheus scraped the run."""
    argv = _job_argv((ROOT / "docker-compose.yml").read_text())
    assert argv[:5] == ["bench", "all-reduce", "--attach", "--clock", "exact"], argv
    sizes = argv[argv.index("-b") :]
    topo = load(ROOT / "deploy" / "topology.toml")
    try:
        started = time.time()
        with cpu_burners():
            result = _compose("run", "--rm", "job", timeout=800, check=False)
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
        assert "# clock: exact," in result.stderr, result.stderr[-2000:]
        virtual = _run(
            sys.executable,
            "-m",
            "rocev2_emu",
            "bench",
            "all-reduce",
            "--virtual",
            "--topology",
            "deploy/topology.toml",
            *sizes,
            timeout=300,
        )
        exact_lines = result.stdout.splitlines()
        assert "attached: one process per node joining 172.30.0.251:7470" in exact_lines[0]
        assert exact_lines[1:] == virtual.stdout.splitlines()[1:]
        assert "# Out of bounds values : 0 OK" in result.stdout
        # every node's container ended with the run, quietly
        for name in topo.nodes:
            cid = _compose("ps", "-a", "-q", name).stdout.split()
            assert len(cid) == 1, (name, cid)
            state = _run("docker", "inspect", "-f", "{{.State.Status}} {{.State.ExitCode}}", cid[0])
            assert state.stdout.split() == ["exited", "0"], (name, state.stdout)
        # Prometheus scraped the run: every rank's collective bytes (the nodes have ended, so
        # their series are stale now; the last scrape may come up to an interval before the end)
        moved = _query(
            prometheus,
            "query",
            query='max_over_time(rocev2_collective_bytes_total{op="all_reduce"}[30m])',
        )
        per_rank = {r["metric"]["rank"]: float(r["value"][1]) for r in moved}
        bench_sizes = [1 << k for k in range(10, 23, 2)]
        iters = int(argv[argv.index("-n") + 1]) + int(argv[argv.index("-w") + 1])
        assert sorted(per_rank) == [str(r) for r in range(8)], per_rank
        assert all(0 < v <= sum(bench_sizes) * 2 * iters for v in per_rank.values()), per_rank
        gaps = _dashboard_gaps(prometheus, started, skip=EXACT_ABSENT)
        assert not gaps, gaps
    finally:
        _compose("down", "-v", "--remove-orphans", timeout=120, check=False)


@pytest.mark.timeout(300)
def test_a_fresh_clone_starts_without_a_secret_file(image: str) -> None:
    """The testbed as a fresh clone has it, with no deploy/fabric.secret: compose reads both
    files, the one-shot secret service makes the secret (mode 0600, beside the topology), the
    wall-clock nodes start with its copy, and the host's ``rocev2-emu link`` proves the same
    secret to them (the exact testbed's nodes get theirs the same way: the other test)."""
    where = Path(tempfile.mkdtemp(prefix="fresh-clone-"))
    files = ["docker-compose.yml", "docker-compose.wall.yml"]
    tracked = _run("git", "ls-files", *files, "deploy").stdout.split()
    assert set(files) <= set(tracked) and "deploy/topology.toml" in tracked, tracked
    for rel in tracked:
        (where / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(ROOT / rel, where / rel)
    secret = where / "deploy" / auth.BESIDE_TOPOLOGY
    assert not secret.exists()

    def compose(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["docker-compose", "-p", "rocev2fresh", "-f", "docker-compose.wall.yml", *argv],
            cwd=where,
            capture_output=True,
            text=True,
            timeout=300,
            check=check,
        )

    names = [sw.name for sw in load(where / "deploy" / "topology.toml").switches]  # link's peers
    try:
        config = compose("config", "-q", check=False)
        assert config.returncode == 0, config.stderr[-2000:]
        exact = ["docker-compose", "-p", "rocev2fresh", "config", "-q"]
        checked = subprocess.run(exact, cwd=where, capture_output=True, text=True, timeout=60)
        assert checked.returncode == 0, checked.stderr[-2000:]
        started = compose("up", "-d", *names, check=False)
        assert started.returncode == 0, started.stdout[-2000:] + started.stderr[-2000:]
        _wait_healthy(names, compose=compose)
        assert secret.stat().st_mode & 0o777 == 0o600
        made = auth.read(secret)
        assert made != auth.read(ROOT / "deploy" / auth.BESIDE_TOPOLOGY)  # its own, not ours
        topology = str(where / "deploy" / "topology.toml")
        link = [sys.executable, "-m", "rocev2_emu", "link", topology, "leaf0", "spine0"]
        env = {k: v for k, v in os.environ.items() if not k.startswith(auth.ENV)}
        down = subprocess.run(
            [*link, "down"], capture_output=True, text=True, timeout=60, env=env, check=False
        )
        assert "is down" in down.stdout, down.stdout + down.stderr
        # the secret service ran again on a second start and kept the secret it made
        again = compose("run", "--rm", "secret")
        assert "fabric secret: kept /deploy/fabric.secret" in again.stdout, again.stdout
        assert auth.read(secret) == made
    finally:
        compose("down", "-v", "--remove-orphans", check=False)
        shutil.rmtree(where, ignore_errors=True)


TRAINING = "rocev2train"  # the training testbed's own compose project (one at a time)


def _training(*argv: str, timeout: float = 300, check: bool = True) -> Any:
    return _run(
        "docker-compose",
        "-p",
        TRAINING,
        "-f",
        "docker-compose.training.yml",
        *argv,
        timeout=timeout,
        check=check,
    )


@pytest.fixture
def torch_image(image: str) -> str:
    """The training image (deploy/torch): the node image with PyTorch.  A torch wheel in pip's
    find-links (``PIP_FIND_LINKS``, where CI's machine keeps its CPU build) goes into the build
    context for the time of the build; without one, pip takes torch from PyPI."""
    wheels = ROOT / "deploy" / "torch" / "wheels"
    found = [
        w
        for d in os.environ.get("PIP_FIND_LINKS", "").split()
        if Path(d).is_dir()
        for w in sorted(Path(d).glob("torch-*.whl"))
    ][-1:]
    copied = []
    try:
        for wheel in found:
            copied.append(wheels / wheel.name)
            shutil.copyfile(wheel, copied[-1])
        build = _training("build", "h0", timeout=1800, check=False)
        assert build.returncode == 0, build.stdout[-2000:] + build.stderr[-2000:]
    finally:
        for path in copied:
            path.unlink(missing_ok=True)
    return "rocev2-emu-torch:latest"


def _train(hosts: list[str], switches: list[str]) -> str:
    """One run of the training testbed: the switches, then the ranks (compose starts them in
    its own order), until every rank's container has exited 0; their logs."""
    _training("up", "-d", *switches)
    _training("up", "-d", *hosts)
    deadline = time.monotonic() + 900
    while True:
        ids = _training("ps", "-q", *hosts).stdout.split()
        states = [
            _run(
                "docker", "inspect", "-f", "{{.State.Status}} {{.State.ExitCode}}", c
            ).stdout.split()
            for c in ids
        ]
        if len(states) == len(hosts) and all(st[0] == "exited" for st in states):
            break
        assert time.monotonic() < deadline, f"the ranks did not finish in 900 s: {states}"
        time.sleep(2)
    logs = str(_training("logs", "--no-color", *hosts, *switches).stdout)
    assert [st[1] for st in states] == ["0"] * len(hosts), logs[-4000:]
    assert "Traceback" not in logs, logs[-4000:]
    _training("rm", "-f", *hosts, *switches)  # the next run starts from fresh containers
    return logs


def _rank0(logs: str) -> list[list[str]]:
    """Rank 0's lines (after torchrun's ``[rank0]:`` prefix), split into words."""
    return [
        line.split("[rank0]:", 1)[1].split() for line in logs.splitlines() if "[rank0]:" in line
    ]


def _emulated(logs: str) -> list[str]:
    """What an exact run must repeat: rank 0's rows without their wall-time column, its
    NIC's counters, and the first host's closing line (the fabric's counters and hops)."""
    rows = []
    for row in _rank0(logs):
        if row and row[0].isdigit():  # step, loss, wall ms, collectives, comm ms, ...
            rows.append(" ".join(row[:2] + row[3:]))
        elif row[:2] == ["#", "fabric:"]:
            rows.append(" ".join(row))
    closing = [line for line in logs.splitlines() if "# fabric:" in line and "frame-hops" in line]
    return rows + [line.split("# fabric:", 1)[1].split("; clock:")[0].strip() for line in closing]


# a training image build (about a minute with a local wheel), eight ranks of DDP in containers
# twice (the second beside two CPU burners)
@pytest.mark.timeout(1500)
def test_compose_training_service_trains_ddp_exactly_over_the_fabric(torch_image: str) -> None:
    """docker-compose.training.yml: the switches as nodes, each host a rank of
    examples/ddp_train.py whose process is the host's NIC, all on the exact clock with the
    first host serving the coordinator; the ranks finish their steps, the testbed's Prometheus
    has every rank's training series (the Collectives dashboard's training panels included),
    and a second run beside two CPU burners reports the same emulated communication per step
    and the same fabric counters."""
    topo = load(ROOT / "deploy" / "topology.toml")
    hosts = [h.name for h in topo.hosts]
    switches = [n for n in topo.nodes if n not in hosts]
    url = "http://127.0.0.1:9090"
    try:
        _training("up", "-d", "prometheus", timeout=900)
        _wait_ready(url)
        started = time.time()
        logs = _train(hosts, switches)
        assert f"rank 0 of {len(hosts)} on leaf-spine, clock: exact" in logs, logs[-4000:]
        assert f"# DDP, {len(hosts)} ranks" in logs, logs[-4000:]
        rows = [r for r in _rank0(logs) if r and r[0].isdigit()]  # step, loss, wall ms, ...
        assert [int(r[0]) for r in rows] == list(range(TRAIN_STEPS)), logs[-4000:]
        assert all(int(r[3]) >= 1 for r in rows)  # every step crossed the fabric
        emulated = _emulated(logs)
        assert len(emulated) == TRAIN_STEPS + 2, logs[-4000:]
        assert "frame-hops" in emulated[-1], emulated

        # every rank's series reached Prometheus while it trained (its target is gone now)
        reported = _query(url, "query", query="max_over_time(rocev2_torch_steps_total[30m])")
        assert sorted(r["metric"]["rank"] for r in reported) == sorted(
            str(r) for r in range(len(hosts))
        ), reported
        assert all(float(r["value"][1]) >= 1 for r in reported), reported
        # and the Collectives dashboard's training panels have data for the run
        text = (ROOT / "deploy" / "grafana" / "dashboards" / "collectives.json").read_text()
        training = [e for e in dashboards.expressions(text) if dashboards.TRAINING_ONLY in e]
        assert training
        for expr in training:
            got = _query(url, "query_range", query=expr, start=started, end=time.time(), step=1)
            assert got, expr

        with cpu_burners():
            again = _train(hosts, switches)
        assert _emulated(again) == emulated, again[-4000:]
    finally:
        _training("down", "-v", "--remove-orphans", timeout=120, check=False)


def _task_address(stack: str, service: str) -> str:
    """The overlay address swarm gave the one task of ``service``."""
    task = _run("docker", "service", "ps", "-q", "--no-trunc", f"{stack}_{service}").stdout.split()
    assert len(task) == 1, (service, task)
    fmt = "{{range .NetworksAttachments}}{{range .Addresses}}{{.}} {{end}}{{end}}"
    addresses = _run("docker", "inspect", "-f", fmt, task[0]).stdout.split()
    assert len(addresses) == 1, (service, addresses)
    return addresses[0].split("/")[0]


@pytest.mark.parametrize("workers", [None, 2])
def test_swarm_stack_runs_the_job_exactly(image: str, workers: int | None) -> None:
    """A single-node swarm (``docker swarm init --advertise-addr 127.0.0.1``) deploys the
    stack: nodes find each other by name on an attachable overlay network and join the
    coordinator the job serves; the job runs once and prints the table the virtual run prints
    on the addresses the tasks got (their names in a hosts file of a mount namespace of its
    own); the stack is removed and the swarm left afterwards.  ``workers``: the stack
    ``compose --workers 2`` writes, two worker services whose tasks answer to their nodes'
    names, not the shipped one of a container per node."""
    require_tool("unshare", "util-linux")
    state = _run("docker", "info", "-f", "{{.Swarm.LocalNodeState}}").stdout.strip()
    joined = state != "active"
    if joined:
        _run("docker", "swarm", "init", "--advertise-addr", "127.0.0.1")
    stack = "rocev2swarm"
    # the stack with a shorter job (sizes up to 64 KiB), beside its topology config
    where = Path(tmp_dir := tempfile.mkdtemp(prefix="stack-"))
    source = ROOT
    if workers is not None:
        topology = str(ROOT / "examples" / "topologies" / "leaf-spine.toml")
        _run(
            sys.executable,
            "-m",
            "rocev2_emu",
            "compose",
            topology,
            "--out",
            tmp_dir,
            "--workers",
            str(workers),
        )
        source = where
    shutil.copy(source / "deploy" / "topology-swarm.toml", where / "topology-swarm.toml")
    text = (source / "deploy" / "docker-stack.yml").read_text()
    short = text.replace('"-e", "4M"', '"-e", "64K"')
    assert short != text
    (where / "docker-stack.yml").write_text(short)
    auth.write(where / auth.BESIDE_TOPOLOGY, auth.new())  # the stack's env_file
    try:
        _run("docker", "stack", "deploy", "-c", f"{tmp_dir}/docker-stack.yml", stack, timeout=120)
        deadline = time.monotonic() + 240
        while True:
            states = _run(
                "docker",
                "service",
                "ps",
                f"{stack}_job",
                "--format",
                "{{.CurrentState}}",
                check=False,
            ).stdout.split("\n")
            current = states[0] if states else ""
            if current.startswith(("Complete", "Failed", "Rejected")):
                break
            assert time.monotonic() < deadline, f"the job did not finish in 240 s: {current!r}"
            time.sleep(2)
        job = _run("docker", "service", "logs", "--raw", f"{stack}_job", check=False)
        logs = job.stdout  # the job's stdout; its stderr comes on the command's own
        assert current.startswith("Complete"), current + "\n" + logs[-3000:] + job.stderr
        assert "# Out of bounds values : 0 OK" in logs
        assert "# clock: exact," in job.stderr, job.stderr[-3000:]
        # the virtual run on the addresses swarm gave the tasks prints the same table
        names = list(load(where / "topology-swarm.toml").nodes)
        services = {n: n for n in names}  # the service whose task answers to each node's name
        if workers is not None:
            groups = process_groups(load(where / "topology-swarm.toml"), workers)
            services = {n: f"worker{i}" for i, group in enumerate(groups) for n in group}
            assert "# rocev2-emu bench all-reduce: leaf-spine" in logs and "2 workers" in logs
        at = {s: _task_address(stack, s) for s in set(services.values())}
        hosts = where / "hosts"
        hosts.write_text("".join(f"{at[services[n]]} {n}\n" for n in names))
        argv = _job_argv(short)
        virtual = _run(
            "unshare",
            "--mount",
            "sh",
            "-c",
            f'mount --bind "{hosts}" /etc/hosts && exec "$@"',
            "virtual",
            *[sys.executable, "-m", "rocev2_emu", "bench", "all-reduce", "--virtual"],
            *["--topology", str(where / "topology-swarm.toml"), *argv[argv.index("-b") :]],
        )
        table = virtual.stdout.splitlines()[1:]
        assert table and [line for line in logs.splitlines() if line in table] == table, logs
    finally:
        _run("docker", "stack", "rm", stack, check=False)
        # the overlay network goes once its tasks are gone
        for _ in range(60):
            nets = _run("docker", "network", "ls", "-q", "-f", f"name={stack}_fabric").stdout
            if not nets.strip():
                break
            time.sleep(1)
        else:  # a failed deploy can leave it (and its vxlan device) behind: the next run fails
            _run("docker", "network", "rm", *nets.split(), check=False)
        if joined:
            _run("docker", "swarm", "leave", "--force", check=False)
        shutil.rmtree(where, ignore_errors=True)
