"""Collectives across real processes: a leaf-spine of switch and host processes on loopback."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import tomllib
import urllib.request
from pathlib import Path

import pytest

from collectives.jobs.launch import run_job
from rocev2_emu.fabric.options import Clock, RunOptions
from rocev2_emu.topology.file import parse
from rocev2_emu.topology.generate import leaf_spine, to_toml
from rocev2_emu.topology.model import Topology
from tests.integration.procs import node_pid

WALL = RunOptions(Clock.WALL, 1000.0)

pytestmark = pytest.mark.integration
BENCH = [sys.executable, "-m", "rocev2_emu", "bench", "all-reduce", "--clock", "wall"]


def leaf_spine_file(loss_link: tuple[str, str] | None = None) -> tuple[Topology, str]:
    """2 spines, 2 leaves, 2 hosts per leaf, 2 ranks per host: 8 ranks, at TDF 1000."""
    data = tomllib.loads(leaf_spine(2, 2, 2, tdf=1000))
    for host in data["host"]:
        host["ranks"] = 2
    for link in data["link"]:
        if loss_link and {link["a"], link["b"]} == set(loss_link):
            link["loss"] = 0.01
    path = Path(tempfile.mkdtemp(prefix="coll-")) / "leaf-spine.toml"
    path.write_text(to_toml(data))
    return parse(data, str(path)), str(path)


def test_every_op_dtype_and_awkward_size_is_right_with_one_percent_loss() -> None:
    """Every collective (ring, hierarchical by host and rack, all-to-all, send/recv) with two
    QPs per connection, through a lossy spine link."""
    topo, path = leaf_spine_file(loss_link=("leaf0", "spine0"))
    params = {"sizes": [0, 1, 9, 1000], "qp_timeout": 6, "qps_per_connection": 2}
    run = run_job(topo, path, "check", params, WALL)
    results, fabric = run.results, run.fabric
    assert sorted(results) == list(range(8))
    assert all(v == [] for v in results.values()), [v for v in results.values() if v][:1]
    assert fabric["retransmitted"] > 0  # the loss was real, and go-back-N recovered it


def _kill_host_when_busy(topo: Topology, host: str) -> None:
    """Kill -9 the node process of ``host`` once its ranks have finished an all-reduce (its
    metrics say so): the job is running, whatever the machine's load made of the start-up."""
    url = f"http://{topo.nodes[host].address}:9100/metrics"
    done = re.compile(r"^\w*collective_operation_seconds_count\{[^}]*\} ([0-9.e+]+)$", re.M)
    deadline = time.monotonic() + 600  # a guard only: the test's own timeout ends a hang
    while time.monotonic() < deadline:
        try:
            body = urllib.request.urlopen(url, timeout=5).read().decode()
        except OSError:
            body = ""  # not serving yet
        if any(float(v) > 0 for v in done.findall(body)):
            break
        time.sleep(0.05)
    os.kill(node_pid(os.getpid(), host), signal.SIGKILL)


@pytest.mark.parametrize("op", ["all_reduce", "all_to_all"])
def test_a_killed_host_makes_every_surviving_rank_raise_within_the_deadline(op: str) -> None:
    topo, path = leaf_spine_file()
    killer = threading.Thread(target=_kill_host_when_busy, args=(topo, "h3"), daemon=True)
    killer.start()
    params = {"rank": -1, "at": 10**6, "count": 16384, "qp_timeout": 6, "timeout": 0.02, "op": op}
    results = run_job(topo, path, "stop", params, WALL).results  # a hang fails on the timeout
    dead = {6, 7}  # h3's ranks
    assert set(results) == set(range(8)) - dead
    for rank, outcome in results.items():
        assert outcome.startswith("CollectiveError"), (rank, outcome)
        assert f"{op} #" in outcome  # names the operation and its sequence number
    # the launcher saw h3 die and said so through the store; or a neighbour named rank 6/7
    assert any(
        "host h3 (ranks [6, 7]) died" in o or "rank 6" in o or "rank 7" in o
        for o in results.values()
    )


def test_bench_all_reduce_prints_nccl_tests_table_with_processes() -> None:
    _, path = leaf_spine_file()
    out = subprocess.run(
        [*BENCH, "--topology", path, "-b", "8", "-e", "64K", "-f", "64", "-n", "2", "-w", "1"],
        capture_output=True,
        text=True,
        timeout=110,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.splitlines()
    rows = [line.split() for line in lines if line and not line.startswith("#")]
    assert [int(r[0]) for r in rows] == [8, 512, 32768]
    assert all(r[2:5] == ["float", "sum", "-1"] and r[8] == "0" and r[12] == "0" for r in rows)
    assert "# Out of bounds values : 0 OK" in lines
    assert any(line.startswith("# Avg bus bandwidth") for line in lines)
    assert any("retransmitted packets" in line for line in lines)  # the fabric summary
