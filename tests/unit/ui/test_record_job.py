"""A virtual collective job recorded for the map's replay: the recording carries every rank's
progress, finished operations and the bytes of the one in progress, and recording does not
change what the job computes."""

from __future__ import annotations

import json
import tomllib
from itertools import pairwise
from pathlib import Path
from typing import Any

from collectives.jobs.launch import run_recorded
from collectives.scenarios.straggler import bursts, straggler_topology
from rocev2_emu.experiments.harness import Mode
from rocev2_emu.topology.file import parse
from rocev2_emu.topology.generate import Servers, fat_tree, single_switch
from rocev2_emu.ui.record import PERIOD, period_for, recorder

ITERS = 3
PARAMS = {"iters": ITERS, "bytes": 256 << 10, "timeout": 0.5}


def test_a_recorded_job_shows_each_ranks_progress_within_its_operations(tmp_path: Path) -> None:
    topo = parse(tomllib.loads(single_switch(4)), "four.toml")
    paths: dict[str, Path] = {}

    def record(topo: Any, setting: str, registry: Any = None) -> Any:
        paths[setting] = tmp_path / f"{setting}.jsonl"
        return recorder(topo, str(paths[setting]), registry=registry)

    plain, _ = run_recorded(topo, "iterations", PARAMS, "plain")
    got, fabric = run_recorded(topo, "iterations", PARAMS, "ring", Mode(record=record))
    assert got == plain  # the recorder watches; the job ends at the same emulated times

    rows = [json.loads(line) for line in paths["ring"].read_text().splitlines()]
    assert "layout" in rows[0]
    samples = rows[1:]
    assert len(samples) > ITERS
    ranks = [s["ranks"] for s in samples]
    assert all(sorted(r, key=int) == ["0", "1", "2", "3"] for r in ranks)
    assert all(r["0"]["host"] == "h0" and r["3"]["host"] == "h3" for r in ranks)
    # between ops a rank shows 0 of 0; within one, a share of its bytes (ring: 2 x 3/4 x size)
    going = [v for r in ranks for v in r.values() if v["op_expected"] > 0]
    assert going and all(v["op_expected"] == 2 * 3 / 4 * (256 << 10) for v in going)
    assert any(0 < v["op_received"] < v["op_expected"] for v in going)
    assert all(v["op_received"] <= v["op_expected"] for v in going)
    ops = [max(v["ops"] for v in r.values()) for r in ranks]
    assert ops == sorted(ops) and ops[-1] == ITERS  # the last sample: when the job ended
    # the recording's fabric totals are the job's: its last sample saw every pause frame sent
    assert samples[-1]["totals"]["pfc_tx"] == fabric["pfc_tx"]
    assert fabric["frame_hops"] > 0


def test_recording_a_congested_run_changes_nothing_it_computes(tmp_path: Path) -> None:
    """Bursts beside the ranks, PFC pausing hop by hop: a run whose order of events a
    recorder run as a trio task would perturb (it did: p99 940 against 955 us)."""
    topo = straggler_topology(1, dcqcn=False)
    params = {"iters": 4, "bytes": 256 << 10, "timeout": 0.5}
    flows = bursts(100e-6, 1 << 20, 1, 20e-6)
    path = tmp_path / "pfc.jsonl"

    def record(topo: Any, setting: str, registry: Any = None) -> Any:
        return recorder(topo, str(path), registry=registry)

    plain = run_recorded(topo, "iterations", params, "pfc", flows=flows)
    recorded = run_recorded(topo, "iterations", params, "pfc", Mode(record=record), flows=flows)
    assert plain[1]["pfc_tx"] > 0  # it was congested
    assert recorded == plain  # every rank's times and every counter of the fabric
    samples = [json.loads(line) for line in path.read_text().splitlines()[1:]]
    assert max(s["totals"]["pfc_tx"] for s in samples) == plain[1]["pfc_tx"]


def test_a_large_fabrics_recording_samples_less_often(tmp_path: Path) -> None:
    """Each sample holds every node: above 64 nodes the period grows with the fabric, so a
    thousand-host recording stays replayable (a k = 16 incast at 10 us wrote 561 MB)."""
    small = parse(tomllib.loads(single_switch(4)), "five.toml")
    data = tomllib.loads(single_switch(127))  # 128 nodes, two of the hosts ranks
    for host in data["host"][2:]:
        host["ranks"] = 0
    data["buffer"] = {"size_bytes": 64 << 20}  # headroom for 127 ports
    big = parse(data, "big.toml")
    assert period_for(small) == PERIOD and period_for(big) == PERIOD * 2
    assert period_for(parse(tomllib.loads(fat_tree(16)), "ft16.toml")) == PERIOD * 1344 / 64

    path = tmp_path / "big.jsonl"
    mode = Mode(record=lambda topo, setting, registry=None: recorder(topo, str(path)))
    run_recorded(big, "iterations", PARAMS, "big", mode)
    times = [json.loads(line)["t"] for line in path.read_text().splitlines()[1:]]
    steps = {round(b - a, 9) for a, b in pairwise(times[:-1])}
    assert len(times) > 4 and steps == {round(2 * PERIOD, 9)}  # the last: when the job ended


def test_a_recorded_job_shows_each_servers_fabric_busy_while_it_reduces(tmp_path: Path) -> None:
    """Two servers of four accelerators, a NIC each: the layout names each server and its
    hosts, and the samples carry each server's fabric - bytes into it per emulated second and
    its busiest port's share of time busy - rising while the ring goes through the servers'
    fabrics, and never above the port's time."""
    topo = parse(tomllib.loads(single_switch(2, servers=Servers(4, "nvlink", True))), "2x4.toml")
    path = tmp_path / "servers.jsonl"
    mode = Mode(record=lambda t, s, registry=None: recorder(t, str(path), registry=registry))
    params = PARAMS | {"bytes": 4 << 20}
    results, _ = run_recorded(topo, "iterations", params, "servers", mode)
    assert sorted(results) == list(range(8))
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    servers = rows[0]["layout"]["servers"]
    assert [(s["name"], s["hosts"]) for s in servers] == [
        ("s0", ["h0", "h1", "h2", "h3"]),
        ("s1", ["h4", "h5", "h6", "h7"]),
    ]
    assert servers[0]["fabric"].startswith("nvlink, 3600 Gb/s per accelerator")
    samples = rows[1:]
    fab = [s["servers"]["s0"] for s in samples if "s0" in s["servers"]]
    assert fab and all(0.0 <= f["util"] <= 1.0 for f in fab)
    assert max(f["util"] for f in fab) > 0.2 and max(f["bps"] for f in fab) > 400e9  # > 4 NICs
    # the last sample's counters: every byte each accelerator sent through the server
    assert fab[-1]["tx_bytes"] == samples[-1]["servers"]["s1"]["tx_bytes"] > 0
