"""The exact process mode (rocev2_emu/runtime/sync.py, runtime/exact.py, fabric/exact.py): a flow
job over one process per node gives the virtual run's JSON byte for byte, while two processes
burn the CPUs beside it; a node that dies stops the run, named."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.integration.procs import node_pid

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
EXE = [sys.executable, "-m", "rocev2_emu"]


@contextmanager
def cpu_burners(n: int = 2) -> Iterator[None]:
    """``n`` processes spinning on the CPUs for as long as the block runs."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]
    try:
        yield
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def _run(argv: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv, cwd=ROOT, capture_output=True, text=True, timeout=timeout, check=False
    )


def _up(args: list[str], timeout: float = 400) -> subprocess.CompletedProcess[str]:
    return _run([*EXE, "up", *args], timeout)


@pytest.mark.timeout(900)
@pytest.mark.parametrize(
    ("topology", "flows", "loss", "pace", "workers"),
    [
        ("single-switch", "incast-4to1", None, None, None),  # PFC, ECN marks, CNPs, DCQCN
        # ECMP, losses, retransmits, a timeout
        ("leaf-spine", "leaf-spine-shift", "0.002", None, None),
        ("single-switch", "incast-4to1", None, "10000", None),  # paced: slower, the same run
        # three processes of edge groups: frames between them cross, the rest stay on a heap
        ("leaf-spine", "leaf-spine-shift", "0.002", None, "3"),
    ],
)
def test_an_exact_run_over_processes_gives_the_virtual_json_while_the_cpus_are_busy(
    tmp_path: Path,
    topology: str,
    flows: str,
    loss: str | None,
    pace: str | None,
    workers: str | None,
) -> None:
    topo = ROOT / "examples" / "topologies" / f"{topology}.toml"
    if loss is not None:
        lossy = tmp_path / f"{topology}.toml"
        lossy.write_text(topo.read_text().replace("loss = 0.0", f"loss = {loss}", 1))
        topo = lossy
    flow_file = str(ROOT / "examples" / "flows" / f"{flows}.toml")
    virtual, exact = tmp_path / "virtual.json", tmp_path / "exact.json"
    done = _up([str(topo), "--virtual", "--flows", flow_file, "--json", str(virtual)])
    assert done.returncode == 0, done.stderr[-2000:]
    with cpu_burners():
        clock = ["--clock", "exact", "--pace", pace] if pace else ["--clock", "exact"]
        if workers:  # virtual time split over processes: the exact clock's windows
            clock = ["--virtual", "--workers", workers]
        done = _up([str(topo), *clock, "--flows", flow_file, "--json", str(exact)])
    assert done.returncode == 0, done.stderr[-2000:]
    assert "clock: exact" in done.stdout
    if workers:
        assert f"{workers} node processes (14 nodes) ready" in done.stdout
    assert "rocev2-emu node: error" not in done.stderr  # the nodes ended quietly
    assert exact.read_bytes() == virtual.read_bytes()
    if loss is not None:
        assert '"retransmitted": 0,' not in virtual.read_text()  # the loss did happen


def _table(out: str) -> list[str]:
    """A bench's results and fabric lines (from its column header on)."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.lstrip("# ").startswith("size"))
    return lines[start:]


def _virtual_then_exact(
    bench: list[str], exact_args: tuple[str, ...] = ()
) -> tuple[subprocess.CompletedProcess[str], subprocess.CompletedProcess[str]]:
    """``bench`` in virtual time, then with processes on the exact clock (and ``exact_args``)
    beside two CPU burners; both must succeed."""
    virtual = _run([*bench, "--virtual"], 300)
    assert virtual.returncode == 0, virtual.stderr[-2000:]
    with cpu_burners():
        exact = _run([*bench, "--clock", "exact", *exact_args], 600)
    assert exact.returncode == 0, exact.stderr[-2000:]
    return virtual, exact


@pytest.mark.timeout(900)
def test_the_all_reduce_with_processes_prints_the_virtual_table_while_the_cpus_are_busy() -> None:
    """The store is a node of the run: the ranks' rendezvous and barriers take the same
    emulated time over processes as in one."""
    bench = [*EXE, "bench", "all-reduce", "-b", "1K", "-e", "256K", "-n", "2", "--algo", "ring"]
    virtual, exact = _virtual_then_exact(bench)
    assert "clock: exact" in exact.stdout and "clock: exact" in exact.stderr
    assert _table(exact.stdout) == _table(virtual.stdout)
    assert "Out of bounds values : 0 OK" in exact.stdout


@pytest.mark.timeout(900)
def test_the_all_reduce_on_two_worker_processes_prints_the_virtual_table() -> None:
    """``--workers 2``: each process hosts a spine, two leaves and their four hosts on one
    engine; the ranks of one process reach the store each as its own host, their replies
    sorted back to them, and the table is the virtual run's."""
    bench = [*EXE, "bench", "all-reduce", "-b", "1K", "-e", "256K", "-n", "2", "--algo", "ring"]
    virtual, exact = _virtual_then_exact(bench, ("--workers", "2"))
    assert "2 workers, clock: exact" in exact.stdout
    assert _table(exact.stdout) == _table(virtual.stdout)
    assert "Out of bounds values : 0 OK" in exact.stdout


@pytest.mark.timeout(600)
def test_bench_virtual_split_over_workers_gives_the_one_process_figures() -> None:
    """``bench virtual --workers 2``: the leaf-spine all-reduce case over two processes has the
    one-process run's frame-hops and emulated time."""
    rows = {}
    for workers in ([], ["--workers", "2"]):
        done = _run([*EXE, "bench", "virtual", "--cases", "a", *workers], 300)
        assert done.returncode == 0, done.stderr[-2000:]
        row = next(line.split() for line in done.stdout.splitlines() if line.split()[:1] == ["a"])
        rows[bool(workers)] = (row[1], row[6])  # frame-hops, emulated us
        if workers:
            assert "split over 2 worker processes on the exact clock" in done.stdout
    assert rows[True] == rows[False]
    assert int(rows[False][0].replace(",", "")) > 40_000  # the 4 MiB ring crossed the fabric


@pytest.mark.timeout(300)
def test_a_node_that_dies_stops_the_exact_run_naming_it(tmp_path: Path) -> None:
    topo = str(ROOT / "examples" / "topologies" / "single-switch.toml")
    flows = str(ROOT / "examples" / "flows" / "incast-4to1-long.toml")
    with _up_until_ready([topo, "--clock", "exact", "--flows", flows], "h2") as proc:
        victim = node_pid(proc.pid, "h2")
        os.kill(victim, signal.SIGKILL)
        _, err = proc.communicate(timeout=120)  # a wall-clock deadline, not a hang
        assert proc.returncode == 1
        assert "h2" in err and ("died" in err or "went away" in err), err[-2000:]


@pytest.mark.timeout(300)
def test_stop_ends_an_exact_run_on_workers_naming_the_process() -> None:
    """``rocev2-emu stop h3`` on an exact run of two worker processes: h3's process ends, with
    the six nodes it shares with h3, and the run stops in one line naming that process."""
    topo = str(ROOT / "examples" / "topologies" / "leaf-spine.toml")
    flows = str(ROOT / "examples" / "flows" / "leaf-spine-shift.toml")
    paced = ["--clock", "exact", "--workers", "2", "--pace", "1000000"]  # 200 us: 200 s of wall
    with _up_until_ready([topo, *paced, "--flows", flows], "h7") as proc:
        stopped = _run([*EXE, "stop", topo, "h3"], 60)
        assert stopped.returncode == 0, stopped.stderr[-2000:]
        assert "node h3 (pid" in stopped.stdout
        _, err = proc.communicate(timeout=120)  # a wall-clock deadline, not a hang
        assert proc.returncode == 1
        assert "spine0,leaf0,leaf1,h0,h1,h2,h3" in err, err[-2000:]


@contextmanager
def _up_until_ready(args: list[str], node: str) -> Iterator[subprocess.Popen[str]]:
    """``rocev2-emu up ARGS`` once its table of ready nodes has reached ``node``; killed, with
    every node, if still running when the block ends."""
    proc = subprocess.Popen(
        [*EXE, "up", *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.split()[:1] == [node]:
                break
        else:
            pytest.fail(f"no READY table: {proc.stderr.read() if proc.stderr else ''}")
        yield proc
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


ASK_CHANGE = """
import json, sys, trio
from rocev2_emu.fabric.blocks import running
from rocev2_emu.fabric.control import attach, change_links_at_once, control
from rocev2_emu.topology.file import load
topo = running(load(sys.argv[1]), sys.argv[1])  # on the block its run took
attach(topo)
print(repr(trio.run(change_links_at_once, topo, [(sys.argv[2], sys.argv[3])], False)))
asks = [  # then what an exact run refuses
    ("leaf0", {"cmd": "set_link", "port": 0, "up": False}),
    ("h0", {"cmd": "set_faults", "faults": {"loss": 0.5}}),
    ("leaf0", {"cmd": "change_links", "pairs": [["leaf0"]], "up": False}),
    ("leaf0", {"cmd": "node_stats", "names": ["h0"]}),  # one process per node here
    ("leaf0", {"cmd": "node_stats", "names": []}),
    ("leaf0", {"cmd": "node_stats", "names": ["leaf0"]}),  # the one it answers
    ("h0", {"cmd": "for_nodes", "names": ["h0"], "request": {"cmd": "set_faults", "faults": {}}}),
]
print(json.dumps([trio.run(control, topo.nodes[n].address, m) for n, m in asks]))
"""


@pytest.mark.timeout(600)
def test_a_link_taken_down_from_outside_an_exact_run_is_the_virtual_run_failed_then(
    tmp_path: Path,
) -> None:
    """``change_links`` (what ``rocev2-emu link`` and the map's clicks send) against a paced
    exact run of the leaf-spine's flows, while two processes burn the CPUs: the run gives the
    change the first emulated instant it can take, every switch applies it then, and the run's
    JSON is the virtual run's with leaf0 <-> spine0 failed at that instant, byte for byte.  The
    per-port commands are refused meanwhile (typed: a malformed change names its field)."""
    from rocev2_emu.fabric.changes import change_links_at
    from rocev2_emu.fabric.flows import load_flows
    from rocev2_emu.fabric.report import write_json
    from rocev2_emu.fabric.virtual import run_flows_virtual
    from rocev2_emu.topology.file import load

    topo_path = str(ROOT / "examples" / "topologies" / "leaf-spine.toml")
    flows = str(ROOT / "examples" / "flows" / "leaf-spine-shift.toml")
    exact, virtual = tmp_path / "exact.json", tmp_path / "virtual.json"
    run = [topo_path, "--clock", "exact", "--pace", "20000", "--flows", flows]
    with cpu_burners(), _up_until_ready([*run, "--json", str(exact)], "h7") as proc:
        asked = subprocess.run(
            [sys.executable, "-c", ASK_CHANGE, topo_path, "leaf0", "spine0"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert asked.returncode == 0, asked.stderr
        at_line, refused = asked.stdout.splitlines()
        at = float(at_line)
        *errors, answered, handed = json.loads(refused)
        link, faults, malformed, elsewhere, empty = (r["error"] for r in errors)
        assert link.startswith("set_link: an exact run changes its fabric only at emulated")
        assert faults.startswith("set_faults: an exact run changes its fabric only at emulated")
        assert malformed == "change_links: pairs[0]: ['leaf0'] is not [a, b] node names"
        assert elsewhere == "node_stats: 'h0' is not a node of this process"
        assert empty == "node_stats: names: 1 to 32 nodes at once"
        assert list(answered["nodes"]) == ["leaf0"] and "pfc_tx" in answered["nodes"]["leaf0"]
        # a request handed to each node is answered as the node answers it (here: refused)
        (refused_there,) = handed["replies"]
        assert refused_there["error"].startswith("set_faults: an exact run changes its fabric")
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err[-2000:]
    topo = load(topo_path)
    down = change_links_at(topo, at, [("leaf0", "spine0")], up=False)
    results, fabric = run_flows_virtual(topo, load_flows(flows, topo), beside=down)
    write_json(str(virtual), results, fabric, topo)
    assert exact.read_bytes() == virtual.read_bytes()
    assert all(r.status.startswith("ok") for r in results)
    spine0 = next(i for i, (_, peer) in enumerate(topo.nodes["leaf0"].ports) if peer == "spine0")
    calm_results, calm = run_flows_virtual(topo, load_flows(flows, topo))
    assert calm["port_tx_bytes"]["leaf0"][spine0] > 0  # without the failure the link is used
    assert (calm_results, calm) != (results, fabric)  # and its failure changed the run


@pytest.mark.timeout(600)
def test_a_links_loss_set_from_outside_an_exact_run_is_the_virtual_run_lossy_from_then(
    tmp_path: Path,
) -> None:
    """``rocev2-emu link A B --loss P`` against a paced exact run of the leaf-spine's flows:
    the run gives the change the first emulated instant it can take, both directions of the
    link take the loss then (the sender's wire, in whichever process), and the run's JSON is
    the virtual run's with that loss from that instant, byte for byte - retransmissions and
    all.  A delay below the link's own (which the run's lookahead counts on) is refused."""
    from rocev2_emu.fabric.changes import change_faults_at
    from rocev2_emu.fabric.flows import load_flows
    from rocev2_emu.fabric.report import write_json
    from rocev2_emu.fabric.virtual import run_flows_virtual
    from rocev2_emu.topology.file import load

    # the leaf-spine's shift, 32 MiB a flow (3 ms: the change lands while they run), and an
    # ACK timeout of 1 ms (a lost tail waits for it: 16.8 ms would be minutes of paced time)
    shipped = (ROOT / "examples" / "topologies" / "leaf-spine.toml").read_text()
    topo_path = str(tmp_path / "leaf-spine.toml")
    Path(topo_path).write_text(shipped + "\n[transport]\nqp_timeout = 8\n")
    shift = (ROOT / "examples" / "flows" / "leaf-spine-shift.toml").read_text()
    flows = str(tmp_path / "flows.toml")
    Path(flows).write_text(shift.replace("size = 1048576", f"size = {32 << 20}"))
    exact, virtual = tmp_path / "exact.json", tmp_path / "virtual.json"
    run = [topo_path, "--clock", "exact", "--pace", "5000", "--flows", flows]
    with _up_until_ready([*run, "--json", str(exact)], "h7") as proc:
        link = [*EXE, "link", topo_path, "leaf0", "spine0"]
        asked = _run([*link, "--loss", "0.01"], 60)
        assert asked.returncode == 0, asked.stderr
        said = asked.stdout.strip()
        assert said.startswith("link leaf0 <-> spine0 (VNI ") and "loss 0.01" in said, said
        at = float(said.split("from t=")[1].split(" us")[0]) * 1e-6
        lower = _run([*link, "--delay-us", "0.5"], 60)
        assert lower.returncode != 0 and "below its own 1 us" in lower.stderr, lower.stderr
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err[-2000:]
    topo = load(topo_path)
    lossy = change_faults_at(topo, at, [("leaf0", "spine0")], {"loss": 0.01})
    results, fabric = run_flows_virtual(topo, load_flows(flows, topo), beside=lossy)
    write_json(str(virtual), results, fabric, topo)
    assert exact.read_bytes().decode() == virtual.read_bytes().decode()
    assert fabric.get("retransmitted", 0) > 0, at  # the loss struck
    assert all(r.status.startswith("ok") for r in results)


def test_the_demo_runs_exact_and_refuses_a_tdf_without_the_wall_clock(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from rocev2_emu.cli import main

    assert main(["demo", "--tdf", "100"]) == 1
    assert "--tdf dilates the wall clock: give --clock wall too" in capsys.readouterr().err
    assert main(["demo", "--clock", "wall", "--workers", "2"]) == 1
    assert "--workers groups the processes of an exact run" in capsys.readouterr().err
    topo = str(ROOT / "examples" / "topologies" / "leaf-spine.toml")
    assert main(["up", topo, "--workers", "2"]) == 1
    assert "--workers groups the processes of an exact run" in capsys.readouterr().err
    assert main(["up", topo, "--virtual", "--workers", "2", "--record", "x.rec"]) == 1
    assert "--record samples a virtual run in one process" in capsys.readouterr().err
    assert main(["bench", "all-reduce", "--clock", "wall", "--workers", "2"]) == 1
    assert "--workers groups the processes of an exact run" in capsys.readouterr().err
    assert main(["scenario", "incast", "--clock", "wall", "--workers", "2"]) == 2
    assert "incast takes --workers with --clock exact only" in capsys.readouterr().err
    assert main(["scenario", "dilation", "--clock", "exact"]) == 2
    assert "it measures the wall clock's dilation" in capsys.readouterr().err


@pytest.mark.timeout(900)
@pytest.mark.parametrize("workers", [None, 2])
def test_a_collective_scenarios_job_with_processes_on_the_exact_clock_is_the_virtual_run(
    workers: int | None,
) -> None:
    """The ecmp-entropy scenario's job on its processes' fabric (8 hosts, 2 leaves, 2 spines,
    the all-reduce over 4 QPs per connection), once as node processes on the exact clock
    (``scenario ecmp-entropy --clock exact``'s path; ``--workers 2``: two processes) while the
    CPUs are busy, once in virtual time on the same topology: every rank's result and the
    fabric's counters agree."""
    from collectives.jobs.job import run_virtual
    from collectives.jobs.launch import run_topology_data
    from collectives.scenarios import entropy
    from rocev2_emu.experiments.harness import Mode
    from rocev2_emu.fabric.options import RunOptions
    from rocev2_emu.topology.file import parse

    data = entropy.entropy_data(1, "5-tuple", small=True, tdf=1.0)
    params = {
        "coll": "all_reduce",
        "bytes": 256 << 10,
        "order": "rank",
        "qps_per_connection": 4,
        "slot_bytes": 64 << 10,
        "timeout": 1.0,
    }
    virtual, vfab = run_virtual(parse(data, "ecmp-entropy.toml"), "entropy_op", params)
    with cpu_burners():
        exact, efab = run_topology_data(
            data,
            "ecmp-entropy",
            1.0,
            "entropy_op",
            params,
            mode=Mode(RunOptions(workers=workers)),
        )
    assert exact == virtual
    assert all(r["wrong"] == 0 for r in exact.values())
    for key in ("port_tx_bytes", "pfc_tx", "ecn_marked", "drops", "retransmitted"):
        assert efab.get(key) == vfab.get(key), key
    assert any(sum(ports) for ports in vfab["port_tx_bytes"].values())  # it crossed the fabric


@pytest.mark.timeout(900)
def test_spines_failing_at_an_emulated_instant_over_processes_is_the_virtual_run() -> None:
    """The spine-failure scenario's job on its processes' fabric (4 hosts, 9 spines), on the
    exact clock while the CPUs are busy: rank 0 asks for spine0 and spine1 to fail at an
    emulated instant (a LinkChange through the coordinator, applied by every switch process);
    the same job in virtual time with the spines failed at that instant gives the same
    all-reduce spans, losses and retransmissions."""
    from collectives.jobs.launch import run_recorded
    from collectives.scenarios import spine_failure as sf
    from rocev2_emu.experiments.harness import Mode
    from rocev2_emu.fabric.changes import change_links_at
    from rocev2_emu.fabric.options import RunOptions
    from rocev2_emu.topology.file import parse

    size = 256 << 10
    with cpu_burners():
        exact = sf.run(1, 9, None, tdf=1.0, mode=Mode(RunOptions()), size=size)
    assert exact["failed_at"] is not None and exact["wrong"] == 0
    assert exact["link_down_drops"] > 0 and exact["retransmitted"] > 0
    topo = parse(sf.spine_data(1, 9, small=True), "spine-failure.toml")
    fail = change_links_at(topo, exact["failed_at"], sf.failed_pairs(topo), up=False)
    results, fab = run_recorded(
        topo, "spine_failure_op", sf.job_params(size), "", None, beside=fail
    )
    spans = [
        (
            min(v["spans"][k][0] for v in results.values()),
            max(v["spans"][k][1] for v in results.values()),
        )
        for k in range(sf.ITERS)
    ]
    assert spans == exact["spans"]
    assert fab["drops"].get("link_down", 0) == exact["link_down_drops"]
    assert fab.get("retransmitted", 0) == exact["retransmitted"]
    assert all(v["wrong"] == 0 for v in results.values())


@pytest.mark.timeout(900)
@pytest.mark.parametrize(
    ("shape", "workers"),
    [
        (["single-switch", "--hosts", "2", "--ranks-per-host", "4"], None),  # one NIC a server
        # a NIC per accelerator on rails: a process per server, then two workers
        (["ai-zone", "--zones", "1", "--racks", "2", "--accelerators", "4", "--rails"], None),
        (["ai-zone", "--zones", "1", "--racks", "2", "--accelerators", "4", "--rails"], "2"),
    ],
)
def test_servers_of_four_accelerators_over_processes_print_the_virtual_table(
    tmp_path: Path, shape: list[str], workers: str | None
) -> None:
    """Two servers of four accelerators each, joined inside by NVLink (rocev2_emu/server), the
    accelerators sharing their server's NIC or with a NIC each (on rails): the intra-server
    transfers run on the engine clock of the process that holds the server, so the
    hierarchical all-reduce over processes prints the virtual run's table while the CPUs are
    busy."""
    topo = tmp_path / "servers.toml"
    made = subprocess.run(
        [*EXE, "topology", *shape], capture_output=True, text=True, check=True, timeout=60
    )
    topo.write_text(made.stdout)
    assert '[server]\nfabric = "nvlink"' in made.stdout
    assert ("ranks = 4" in made.stdout) != ('server = "s1"' in made.stdout)
    bench = [*EXE, "bench", "all-reduce", "-b", "64K", "-e", "256K", "-n", "1", "--topology"]
    bench += [str(topo), "--algo", "hierarchical"]
    virtual, exact = _virtual_then_exact(bench, ("--workers", workers) if workers else ())
    assert _table(exact.stdout) == _table(virtual.stdout)
    assert "Out of bounds values : 0 OK" in exact.stdout
    if 'server = "s1"' in made.stdout and workers is None:  # 6 switches, a process per server
        assert "a server's hosts in one" in exact.stdout
        assert "of 8 processes woken per window" in exact.stdout + exact.stderr


@pytest.mark.timeout(300)
def test_the_map_samples_every_node_of_an_exact_run(tmp_path: Path) -> None:
    """The live map's sampler against an exact run (paced, so that it lasts): every switch
    and host answers (hosts answer ``map`` on the exact clock too), in emulated time, and the
    flow's links show its load."""
    import trio

    from rocev2_emu.control import auth
    from rocev2_emu.fabric.blocks import running
    from rocev2_emu.topology.file import load
    from rocev2_emu.ui.sampler import Sampler

    topo_path = tmp_path / "two.toml"
    made = _run([*EXE, "topology", "single-switch", "--hosts", "2"], 60)
    topo_path.write_text(made.stdout)
    flows = tmp_path / "flows.toml"
    flows.write_text(f'[[flow]]\nsrc = "h0"\ndst = "h1"\nsize = {64 << 20}\n')
    up = [*EXE, "up", str(topo_path), "--clock", "exact", "--flows", str(flows), "--pace", "5000"]
    proc = subprocess.Popen(
        up, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        assert proc.stdout is not None
        seen = []
        for line in proc.stdout:  # readiness: every node process said so
            seen.append(line)
            if "node processes ready" in line:
                break
        assert any("node processes ready" in s for s in seen), "".join(seen)[-2000:]
        topo = running(load(topo_path), str(topo_path))  # on the block the run took
        auth.use(auth.load(str(topo_path)) or b"")
        sampler = Sampler(topo)

        async def two() -> dict[str, Any]:
            await sampler.sample()
            with trio.fail_after(60):
                while True:  # until the flow's bytes show between two samples
                    await trio.sleep(0.5)
                    got = await sampler.sample()
                    if got["links"][0]["ab_util"] > 0:
                        return got

        got = trio.run(two)
        assert got["missing"] == [] and 0 < got["t"] < 0.1  # emulated seconds
        assert set(got["nodes"]) == {"sw0", "h0", "h1"}
    finally:
        proc.send_signal(signal.SIGINT)  # as Ctrl-C: the supervisor stops its nodes
        try:
            proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()


@pytest.mark.timeout(600)
def test_node_processes_started_by_hand_join_an_attached_exact_bench(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the compose testbed does, with local processes: every node started first with
    ``--clock exact --sync ADDR:PORT --join-timeout`` (waiting for a coordinator nothing serves
    yet), then ``bench all-reduce --attach --clock exact --sync ADDR:PORT`` serves it - the
    table is the virtual run's, beside two CPU burners, and every node process exits 0 when the
    job ends.  A node whose coordinator never comes gives up after its timeout, in one line."""
    from rocev2_emu.control import auth
    from rocev2_emu.fabric.blocks import ENV, first_free
    from rocev2_emu.topology.file import load

    topo = tmp_path / "single-switch.toml"
    topo.write_text((ROOT / "examples" / "topologies" / "single-switch.toml").read_text())
    auth.write(tmp_path / auth.BESIDE_TOPOLOGY, auth.new(), exclusive=True)  # the fabric's
    sync = f"127.0.0.1:{_free_port()}"
    sizes = ["-b", "1K", "-e", "64K", "-n", "1", "-w", "1"]
    bench = [*EXE, "bench", "all-reduce", "--topology", str(topo), *sizes]
    virtual = _run([*bench, "--virtual"], 300)
    assert virtual.returncode == 0, virtual.stderr[-2000:]
    node = [*EXE, "node", str(topo)]
    exact = ["--clock", "exact", "--sync", sync]
    fabric = load(topo)
    names = list(fabric.nodes)
    # every process on a free block of 127/8, as a run tells its nodes (a fabric may run on
    # 127.10 beside the tests)
    monkeypatch.setenv(ENV, str(first_free(fabric, names)))

    def start_nodes() -> dict[str, subprocess.Popen[str]]:
        return {
            name: subprocess.Popen(
                [*node, name, *exact, "--join-timeout", "120"],
                cwd=ROOT,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for name in names
        }

    nodes = start_nodes()
    started = list(nodes.values())  # every process this test starts, reaped at the end
    try:
        with cpu_burners():
            attached = _run([*bench, "--attach", *exact], 300)
        assert attached.returncode == 0, attached.stderr[-2000:]
        assert f"joining {sync}, clock: exact" in attached.stdout.splitlines()[0]
        assert _table(attached.stdout) == _table(virtual.stdout)
        for name, proc in nodes.items():
            out, err = proc.communicate(timeout=60)
            assert proc.returncode == 0, (name, err[-2000:])
            assert out.startswith(f"READY {name} "), out
        # a node that goes away in the run stops the job in one line naming it
        nodes = start_nodes()
        job = subprocess.Popen(
            [*bench, "--attach", *exact, "-e", "4M", "-n", "5"],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        started += [*nodes.values(), job]
        victim = nodes[names[-1]]
        assert victim.stdout is not None
        assert victim.stdout.readline().startswith("READY ")  # it has joined the run
        victim.kill()
        _, err = job.communicate(timeout=120)  # a wall-clock deadline, not a hang
        assert job.returncode == 1, err[-2000:]
        assert f"error: node {names[-1]} went away" in err, err[-2000:]
        assert "Traceback" not in err, err[-2000:]
    finally:
        for proc in started:
            if proc.poll() is None:
                proc.kill()
            proc.communicate(timeout=10)  # reaped, its pipes closed
    alone = _run([*node, names[0], *exact, "--join-timeout", "0.5"], 60)
    assert alone.returncode == 1
    assert f"no coordinator at {sync} within 0.5 s" in alone.stderr, alone.stderr[-2000:]


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.timeout(600)
def test_datagrams_from_a_stranger_are_dropped_and_the_exact_run_goes_on(tmp_path: Path) -> None:
    """A local process with no secret sends datagrams to the link ports of a paced exact run's
    nodes, with the VNIs of their links: each node drops and counts them (a line on stderr),
    and the run ends as the virtual run does, JSON byte for byte (it used to stop)."""
    import socket

    from rocev2_emu.fabric.blocks import running
    from rocev2_emu.topology.file import load

    topo_path = str(ROOT / "examples" / "topologies" / "single-switch.toml")
    flows = str(ROOT / "examples" / "flows" / "incast-4to1.toml")
    exact, virtual = tmp_path / "exact.json", tmp_path / "virtual.json"
    done = _up([topo_path, "--virtual", "--flows", flows, "--json", str(virtual)])
    assert done.returncode == 0, done.stderr[-2000:]
    run = [topo_path, "--clock", "exact", "--pace", "20000", "--flows", flows]
    with (
        _up_until_ready([*run, "--json", str(exact)], "h4") as proc,
        socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as stranger,
    ):
        topo = running(load(topo_path), topo_path)  # on the block the run took
        stranger.bind(("127.0.0.1", 0))
        for node in ("sw0", "h4", "h0"):
            address = topo.nodes[node].address
            for link, _ in topo.nodes[node].ports:
                vxlan = bytes((0x08, 0, 0, 0)) + (link.vni << 8).to_bytes(4, "big")
                for _ in range(3):
                    stranger.sendto(vxlan + bytes(60), (address, 14789))
        out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-2000:]
    assert "datagrams from no peer dropped (" in out and "sw0 " in out, out  # the run's summary
    assert exact.read_bytes() == virtual.read_bytes()


def _spoofed_udp(src: str, dst: str, port: int, payload: bytes) -> None:
    """One UDP datagram from ``src``:``port`` to ``dst``:``port`` whatever binds ``src``: a raw
    socket (root only) - what a link peer that breaks the run's framing would send."""
    import socket
    import struct

    udp = struct.pack("!HHHH", port, port, 8 + len(payload), 0) + payload
    ip = struct.pack(
        "!BBHHHBBH4s4s", 0x45, 0, 20 + len(udp), 0, 0, 64, 17, 0,
        socket.inet_aton(src), socket.inet_aton(dst),
    )  # fmt: skip
    with socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_RAW) as raw:
        raw.sendto(ip + udp, (dst, 0))


@pytest.mark.timeout(300)
def test_a_peer_that_breaks_the_framing_stops_the_run_and_the_node_says_why() -> None:
    """A datagram from sw0's own address to h4 with no room for the sync trailer (a raw
    socket: only root sends from a peer's address) stops the exact run, and the line the
    user reads is h4's own, not only that its connection closed."""
    if os.geteuid() != 0:
        message = "sending from a link peer's address needs root (a raw socket)"
        if os.environ.get("CI") == "true":
            pytest.fail(message + "; CI runs as root", pytrace=False)
        pytest.skip(message)
    from rocev2_emu.fabric.blocks import running
    from rocev2_emu.topology.file import load

    topo_path = str(ROOT / "examples" / "topologies" / "single-switch.toml")
    flows = str(ROOT / "examples" / "flows" / "incast-4to1.toml")
    run = [topo_path, "--clock", "exact", "--pace", "20000", "--flows", flows]
    with _up_until_ready(run, "h4") as proc:
        topo = running(load(topo_path), topo_path)  # on the block the run took
        link = next(lk for lk, peer in topo.nodes["h4"].ports if peer == "sw0")
        vxlan = bytes((0x08, 0, 0, 0)) + (link.vni << 8).to_bytes(4, "big")
        sw0, h4 = topo.nodes["sw0"].address, topo.nodes["h4"].address
        _spoofed_udp(sw0, h4, 14789, vxlan + bytes(4))
        _, err = proc.communicate(timeout=120)  # a wall-clock deadline, not a hang
    assert proc.returncode == 1, err[-2000:]
    assert "node h4 went away" in err, err[-2000:]
    assert "it said: rocev2-emu" in err and "no room for the sync trailer" in err, err[-2000:]


@pytest.mark.timeout(600)
@pytest.mark.parametrize("workers", [None, "2"])
def test_a_timing_only_exact_run_over_processes_is_the_virtual_run_with_real_bytes(
    tmp_path: Path, workers: str | None
) -> None:
    """``--payload none`` with node processes (their frames cross as their headers): the
    JSON is the one-process virtual run's with real payloads, every retransmission of a lossy
    leaf-spine included, but for ``verified`` (null: not checked)."""
    shipped = (ROOT / "examples" / "topologies" / "leaf-spine.toml").read_text()
    topo = tmp_path / "leaf-spine.toml"
    topo.write_text(shipped.replace("loss = 0.0", "loss = 0.002", 1))
    flows = str(ROOT / "examples" / "flows" / "leaf-spine-shift.toml")
    virtual, exact = tmp_path / "virtual.json", tmp_path / "exact.json"
    done = _up([str(topo), "--virtual", "--flows", flows, "--json", str(virtual)])
    assert done.returncode == 0, done.stderr[-2000:]
    split = ["--workers", workers] if workers else []
    run = [str(topo), "--clock", "exact", *split, "--payload", "none", "--flows", flows]
    done = _up([*run, "--json", str(exact)])
    assert done.returncode == 0, done.stderr[-2000:]
    assert "ok, not checked (timing only)" in done.stdout
    real = json.loads(virtual.read_text())
    assert real["fabric"]["retransmitted"] > 0
    for r in real["results"]:
        assert r.pop("verified") is True
    timing = json.loads(exact.read_text())
    for r in timing["results"]:
        assert r.pop("verified") is None
    assert json.dumps(real, sort_keys=True) == json.dumps(timing, sort_keys=True)


@pytest.mark.timeout(300)
def test_a_run_beside_another_fabric_takes_a_block_of_its_own(tmp_path: Path) -> None:
    """The first free block's first link port taken (another fabric's switch, here a socket): a
    run with a job takes a block after it, says so, and gives the virtual run's JSON; the block
    is not said once the run is over."""
    import socket

    from rocev2_emu.fabric.blocks import blocks_file

    topo = str(ROOT / "examples" / "topologies" / "single-switch.toml")
    flows = str(ROOT / "examples" / "flows" / "incast-4to1.toml")
    virtual, exact = tmp_path / "virtual.json", tmp_path / "exact.json"
    done = _up([topo, "--virtual", "--flows", flows, "--json", str(virtual)])
    assert done.returncode == 0, done.stderr[-2000:]
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as other:
        for block in range(10, 250):  # the first block free (this suite may run beside a fabric)
            try:
                other.bind((f"127.{block}.0.10", 14789))
                break
            except OSError:
                continue
        done = _up([topo, "--flows", flows, "--json", str(exact)])
    assert done.returncode == 0, done.stderr[-2000:]
    said = re.search(r"on 127\.(\d+)\.0\.0/16 \(127\.10: another fabric runs there\)", done.stderr)
    assert said is not None and int(said.group(1)) > block, done.stderr[-2000:]
    assert exact.read_bytes() == virtual.read_bytes()
    assert not blocks_file(topo).exists()
