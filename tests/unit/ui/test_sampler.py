"""The map's sampler without processes: answers from a fake fabric, rates from byte counters
over emulated time, pauses from either end, the slowest rank; and the layout's tiers."""

from __future__ import annotations

import tomllib
from typing import Any

import trio
from prometheus_client import CollectorRegistry

from collectives.metrics import HostCollectiveMetrics
from rocev2_emu.fabric.nodes import rank_progress
from rocev2_emu.fabric.topogen import fat_tree, single_switch
from rocev2_emu.fabric.topology_file import parse
from rocev2_emu.ui.sampler import Sampler, layout


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


def test_rank_progress_reads_the_collectives_series() -> None:
    registry = CollectorRegistry()
    metrics = HostCollectiveMetrics(registry)
    for _ in range(3):
        metrics.rank(5).observe("all_reduce", 4096, 1e-5, 1.75)
    metrics.rank(6).observe("broadcast", 100, 1e-6, 1.0)
    assert rank_progress(registry) == {
        "5": {"ops": 3.0, "bytes": 3 * 4096.0},
        "6": {"ops": 1.0, "bytes": 100.0},
    }
