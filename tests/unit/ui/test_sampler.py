"""The map's sampler without processes: answers from a fake fabric, rates from byte counters
over emulated time, pauses from either end, the slowest rank; and the layout's tiers."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from prometheus_client import CollectorRegistry

from collectives.comm.metrics import HostCollectiveMetrics
from rocev2_emu.fabric.nodes import rank_progress
from rocev2_emu.topology.file import parse
from rocev2_emu.topology.generate import fat_tree, single_switch
from rocev2_emu.ui.sampler import Sampler, layout

LEAF_SPINE = Path(__file__).parents[3] / "examples" / "topologies" / "leaf-spine.toml"
HOSTS_OF_POD1 = ["h4", "h5", "h6", "h7"]


def test_rates_pauses_and_the_slowest_rank_from_two_samples() -> None:
    topo = parse(tomllib.loads(single_switch(2)), "two.toml")
    state: dict[str, Any] = {"now": 0.0, "tx": [0, 0], "nic": [0, 0], "ops": [3, 3]}
    names = {topo.nodes[n].address: n for n in topo.nodes}

    async def ask(address: str, msg: dict[str, Any]) -> Any:
        name = names[address]
        if name == "sw0":  # port 0 faces h0, port 1 faces h1
            ports = [
                {
                    "tx_bytes": state["tx"][i],
                    "queue_bytes": 4096 * i,
                    "paused": i == 1,
                    "pfc_tx": 2,
                    "ecn_marked": 1,
                    "drops": 0,
                    "up": True,
                }
                for i in range(2)
            ]
            return {"now": state["now"], "ports": ports}
        i = int(name[1:])
        return {
            "nic_tx_bytes": state["nic"][i],
            "nic_paused": i == 0,
            "retransmitted": i,
            "qp_rates": {"0x000011": 5e10},
            "ranks": {str(i): {"ops": state["ops"][i], "bytes": 1000.0 * state["ops"][i]}},
        }

    async def main() -> tuple[dict[str, Any], dict[str, Any]]:
        sampler = Sampler(topo, ask)
        first = await sampler.sample()
        # 1 ms later: the switch sent 12.5 MB to h1 (100 Gbit/s), h0 sent it 6.25 MB
        state.update(now=1e-3, tx=[0, 12_500_000], nic=[6_250_000, 0], ops=[4, 5])
        return first, await sampler.sample()

    first, second = trio.run(main)
    assert all(lk["ab_bps"] == lk["ba_bps"] == 0.0 for lk in first["links"])
    h0, h1 = second["links"]  # links h0-sw0 and h1-sw0: "ab" is host to switch
    assert h0["ab_util"] == 0.5 and h0["ab_paused"] is True  # h0's NIC under XOFF
    assert h1["ba_util"] == 1.0 and h1["ba_paused"] is True and h1["ba_queue"] == 4096
    assert second["totals"]["pfc_tx"] == 4 and second["totals"]["retransmitted"] == 1
    assert second["nodes"]["h0"]["qp_rates"] == {"0x000011": 5e10}
    assert second["slowest"] == 0 and first["slowest"] is None  # level at first


def test_layout_puts_hosts_below_leaves_below_spines_below_cores() -> None:
    topo = parse(tomllib.loads(fat_tree(4)), "k4.toml")
    tiers = {n["name"]: n["tier"] for n in layout(topo)["nodes"]}
    kinds = {name: topo.nodes[name].kind for name in tiers}
    assert {tiers[n] for n, k in kinds.items() if k == "host"} == {0}
    assert sorted(set(tiers.values())) == [0, 1, 2, 3]  # hosts, edge, aggregation, core
    assert layout(topo)["tiers"] == 4


def test_a_fat_tree_is_drawn_by_pod_and_a_leaf_spine_is_not() -> None:
    drawn = layout(parse(tomllib.loads(fat_tree(4)), "k4.toml"))
    assert [b["pod"] for b in drawn["pods"]] == [0, 1, 2, 3]
    by_pod: dict[int, list[str]] = {}
    for n in drawn["nodes"]:
        if "pod" in n:
            band = drawn["pods"][n["pod"]]
            assert band["x0"] < n["x"] < band["x1"]  # inside its pod's band
            by_pod.setdefault(n["pod"], []).append(n["name"])
        else:
            assert n["name"].startswith("core")  # only the top tier spans the pods
    assert sorted(by_pod[1]) == sorted(["agg1_0", "agg1_1", "edge1_0", "edge1_1", *HOSTS_OF_POD1])
    leaf_spine = layout(parse(tomllib.loads(Path(LEAF_SPINE).read_text()), "ls.toml"))
    assert leaf_spine["pods"] == [] and not any("pod" in n for n in leaf_spine["nodes"])


def test_rank_progress_reads_the_collectives_series() -> None:
    registry = CollectorRegistry()
    metrics = HostCollectiveMetrics(registry)
    for _ in range(3):
        metrics.rank(5).observe("all_reduce", 4096, 1e-5, 1.75)
    metrics.rank(6).observe("broadcast", 100, 1e-6, 1.0)
    going = {"received": 300.0}
    metrics.rank(6).progress(lambda: going["received"], lambda: 1200.0)  # an op in progress
    idle = {"op_received": 0.0, "op_expected": 0.0}
    assert rank_progress(registry) == {
        "5": {"ops": 3.0, "bytes": 3 * 4096.0, **idle},
        "6": {"ops": 1.0, "bytes": 100.0, "op_received": 300.0, "op_expected": 1200.0},
    }
    going["received"] = 900.0  # read when asked, not when set
    assert rank_progress(registry, {6}) == {
        "6": {"ops": 1.0, "bytes": 100.0, "op_received": 900.0, "op_expected": 1200.0}
    }


def test_the_slowest_rank_counts_the_bytes_of_the_operation_in_progress() -> None:
    topo = parse(tomllib.loads(single_switch(2)), "two.toml")
    names = {topo.nodes[n].address: n for n in topo.nodes}

    async def ask(address: str, msg: dict[str, Any]) -> Any:
        name = names[address]
        if name == "sw0":
            port = {"tx_bytes": 0, "queue_bytes": 0, "paused": False, "up": True}
            return {"now": 1e-3, "ports": [{**port, "pfc_tx": 0, "ecn_marked": 0, "drops": 0}] * 2}
        i = int(name[1:])  # both have finished 2 ops; h1's rank is further into the third
        row = {"ops": 2.0, "bytes": 8192.0, "op_received": 1000.0 * (i + 1), "op_expected": 4e3}
        return {"ranks": {str(i): row}}

    sample = trio.run(Sampler(topo, ask).sample)
    assert sample["slowest"] == 0 and sample["ranks"][1]["op_received"] == 2000.0


def test_nodes_are_asked_one_after_another_and_rates_use_each_senders_time() -> None:
    topo = parse(tomllib.loads(single_switch(2)), "two.toml")
    names = {topo.nodes[n].address: n for n in topo.nodes}
    asked: dict[str, float] = {}
    state = {"now": 0.0, "nic": 0}

    async def ask(address: str, msg: dict[str, Any]) -> Any:
        name = names[address]
        asked[name] = trio.current_time()
        if name == "sw0":
            port = {"tx_bytes": 0, "queue_bytes": 0, "paused": False, "up": True}
            ports = [{**port, "pfc_tx": 0, "ecn_marked": 0, "drops": 0}] * 2
            return {"now": state["now"] + 5e-3, "ports": ports}  # the switch read later
        return {"now": state["now"], "nic_tx_bytes": state["nic"] if name == "h0" else 0}

    async def main() -> dict[str, Any]:
        sampler = Sampler(topo, ask)
        await sampler.sample(spread=0.3)
        assert sorted(asked.values()) == pytest.approx([0.0, 0.1, 0.2])  # 3 nodes over 0.3 s
        state.update(now=1e-3, nic=6_250_000)  # h0 sent 6.25 MB in 1 ms of its own time
        return await sampler.sample()

    sample = trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert sample["links"][0]["ab_util"] == 0.5  # 50 Gbit/s by h0's clock, not the switch's
    assert sample["t"] == 6e-3


def test_a_switch_that_does_not_answer_is_shown_missing_not_a_failed_sample() -> None:
    """An exact run's switch may not answer a sample (its process not yet started: the torch
    ranks still joining); the sample goes on without it (it crashed the map once)."""
    topo = parse(tomllib.loads(single_switch(2)), "two.toml")
    names = {topo.nodes[n].address: n for n in topo.nodes}

    async def ask(address: str, msg: dict[str, Any]) -> Any:
        if names[address] == "sw0":
            raise OSError("connection refused")
        return {"now": 0.0, "nic_tx_bytes": 0}

    sample = trio.run(Sampler(topo, ask).sample)
    for link in sample["links"]:  # the switch's end: no queue, no pause, no rate
        assert link["ba_queue"] == 0 and link["ba_paused"] is False and link["ba_tx"] is None
