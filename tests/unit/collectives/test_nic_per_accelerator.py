"""Servers of a NIC per accelerator (``[[host]] server`` in the topology, ``topology
--nic-per-accelerator``, ai-zone's servers): the file's checks, the generators, where the ranks
go (local ranks, a ring through each server that leaves and enters on one rail, the hierarchy's
server level, the cost model's ranks per NIC), every collective right on them, their
intra-server traffic off the network, and the wall clock's refusal."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import pytest

import collectives.bench.checks  # noqa: F401  (registers the check job)
from collectives.bench.nccl import params as bench_params
from collectives.comm.cost import hierarchy_ratio
from collectives.comm.placement import hierarchy, ring_order
from collectives.jobs.job import run_virtual
from collectives.jobs.places import places_for, server_ranks
from collectives.launcher import launch
from rocev2_emu.fabric.layout import process_layout
from rocev2_emu.fabric.options import Clock, RunOptions
from rocev2_emu.testbed import compose
from rocev2_emu.topology.file import parse
from rocev2_emu.topology.generate import Servers, ai_zone, fat_tree, leaf_spine, single_switch
from rocev2_emu.topology.model import Topology, TopologyError, refuse_split_servers
from rocev2_emu.topology.processes import process_groups

WALL = RunOptions(Clock.WALL, 1.0)


def two_servers(nics: bool = True, fabric: str = "nvlink") -> Topology:
    """Two servers of four accelerators on one switch: a NIC each, or one shared."""
    return parse(tomllib.loads(single_switch(2, servers=Servers(4, fabric, nics))), "s.toml")


def rails() -> Topology:
    """ai-zone, one zone of two racks of one server of four accelerators, on rails."""
    return parse(tomllib.loads(ai_zone(1, 2, 1, 4, rails=True)), "rails.toml")


def test_the_topology_file_groups_hosts_into_servers_and_checks_the_key() -> None:
    topo = two_servers()
    assert topo.servers == {"s0": ["h0", "h1", "h2", "h3"], "s1": ["h4", "h5", "h6", "h7"]}
    assert topo.server_of("h5") == "s1" and topo.server_hosts("h2") == ["h0", "h1", "h2", "h3"]
    assert [topo.nodes[h].ranks for h in topo.servers["s0"]] == [1, 1, 1, 1]
    shared = two_servers(nics=False)
    assert shared.servers == {"h0": ["h0"], "h1": ["h1"]} and shared.server_of("h1") == "h1"
    data = tomllib.loads(single_switch(2, servers=Servers(4, "nvlink", True)))
    data["host"][0]["ranks"] = 2
    with pytest.raises(TopologyError, match=r"h0.ranks = 2: a host in a server is one"):
        parse(data, "bad.toml")
    data = tomllib.loads(single_switch(2, servers=Servers(4, "nvlink", True)))
    data["host"][0]["server"] = "sw0"
    with pytest.raises(TopologyError, match=r"h0.server = 'sw0': names another node"):
        parse(data, "bad.toml")
    data["host"][0]["server"] = 3
    with pytest.raises(TopologyError, match=r"h0.server = 3: must be a server's name"):
        parse(data, "bad.toml")


def test_the_generators_write_a_nic_per_accelerator_under_the_servers_leaf() -> None:
    text = leaf_spine(2, 2, 2, servers=Servers(2, "pcie", True))
    assert "--ranks-per-host 2 --server-fabric pcie --nic-per-accelerator" in text
    topo = parse(tomllib.loads(text), "ls.toml")
    assert list(topo.servers) == ["s0", "s1", "s2", "s3"] and topo.server.kind == "pcie"
    for hosts in topo.servers.values():  # a server's NICs under one leaf
        assert len({topo.host_link(h)[1].name for h in hosts}) == 1
    # the fat-tree keeps its link order: each server's NICs right after its edge's uplinks
    tree = parse(tomllib.loads(fat_tree(4, servers=Servers(2, "nvlink", True))), "ft.toml")
    assert len(tree.hosts) == 32 and len(tree.servers) == 16
    assert [(lk.a, lk.b) for lk in tree.links[2:4]] == [("h0", "edge0_0"), ("h1", "edge0_0")]
    zone = rails()  # ai-zone: a server's accelerators on rails 0-3
    assert zone.servers == {"s0": ["h0", "h1", "h2", "h3"], "s1": ["h4", "h5", "h6", "h7"]}
    assert [zone.host_link(h)[1].name for h in ("h4", "h7")] == ["rail0_0", "rail0_3"]


def test_ranks_of_a_server_are_its_accelerators_and_the_ring_leaves_on_the_rail_it_enters() -> None:
    topo = rails()
    places = places_for(topo)
    assert [(p.host, p.server, p.local_rank) for p in places[3:5]] == [
        ("h3", "s0", 3),
        ("h4", "s1", 0),
    ]
    assert server_ranks(topo, "h6") == 4
    # through s0 forwards, s1 backwards: both network hops join one accelerator index (a rail)
    assert ring_order(places, "topology") == [0, 1, 2, 3, 7, 6, 5, 4]
    # a NIC shared by a server's ranks: its ring order as before (server-major, forwards)
    assert ring_order(places_for(two_servers(nics=False)), "topology") == list(range(8))
    h = hierarchy(places)  # the server over NVLink, then each rail, then nothing left on top
    assert h.levels == ["server", "rack", "top"] and h.ranks_per_nic == 1
    assert h.rings["rack"]["rack:0"] == [0, 4] and h.rings["rack"]["rack:3"] == [3, 7]
    shared = hierarchy(places_for(two_servers(nics=False)))
    assert shared.levels == ["server", "top"] and shared.ranks_per_nic == 4
    # against the ring's 2 x 7/8 / 100: NVLink's 2 x 3/4 / 3600, then a quarter of S over
    # each rail - or over the one NIC that the server's four rings above it share
    each, one = (hierarchy_ratio(x, 8, 100.0, 3600.0) for x in (hierarchy(places), shared))
    assert each == pytest.approx((1.5 / 3600 + 0.25 / 100) / 0.0175)
    assert one == pytest.approx((1.5 / 3600 + 4 * 0.25 / 100) / 0.0175)


@pytest.mark.slow
def test_every_op_and_dtype_is_right_on_servers_of_a_nic_per_accelerator() -> None:
    for topo in (two_servers(), rails()):
        results, _ = run_virtual(topo, "check", {"sizes": [0, 1, 17, 1000]})
        assert sorted(results) == list(range(8))
        assert all(v == [] for v in results.values()), [v for v in results.values() if v][:1]


def _bench(topo: Topology, algo: str) -> tuple[float, dict[str, Any]]:
    results, fab = run_virtual(topo, "bench", bench_params([1 << 20], algo=algo))
    rows = [row for r in results.values() for row in r]
    assert all(row[k]["wrong"] == 0 for row in rows for k in ("outofplace", "inplace"))
    return max(row["outofplace"]["time"] for row in rows), fab


def test_a_server_keeps_its_traffic_off_the_network_and_a_nic_each_beats_a_shared_one() -> None:
    """One server of four NICs: every byte of its all-reduce goes over NVLink, none through
    the switch.  Two servers, hierarchical 1 MiB: with a NIC per accelerator the four rings
    across the servers have a NIC each, where they share one otherwise (33.26 against 96.6
    us when this test was written)."""
    alone = parse(tomllib.loads(single_switch(1, servers=Servers(4, "nvlink", True))), "1.toml")
    _, fab = _bench(alone, "ring")
    assert sum(fab["switch_tx_bytes"].values()) == 0
    each, _ = _bench(two_servers(), "hierarchical")
    shared, _ = _bench(two_servers(nics=False), "hierarchical")
    assert each < shared / 2, (each, shared)


def test_servers_stay_in_one_process_and_a_process_per_node_refuses_them(tmp_path: Path) -> None:
    topo = rails()
    switches = ["ctsw0_0", "ctsw0_1", "rail0_0", "rail0_1", "rail0_2", "rail0_3"]
    s0, s1 = topo.servers["s0"], topo.servers["s1"]
    assert process_groups(topo) == [[n] for n in switches] + [s0, s1]
    two = process_groups(topo, 2)  # a server each; the rails and CTSWs beside their neighbours
    assert [set(s0) <= set(two[0]), set(s1) <= set(two[1])] == [True, True]
    assert sorted(n for g in two for n in g) == sorted(topo.nodes)
    assert process_layout(topo, None) == "one process per node (a server's hosts in one)"
    with pytest.raises(TopologyError, match=r"server 's1' \(h4, h5, h6, h7\) has a NIC per"):
        refuse_split_servers(topo, ["h5"])
    refuse_split_servers(topo, ["rail0_0"])  # a switch alone is fine
    refuse_split_servers(two_servers(nics=False))  # so is a server of one NIC
    # launch (a process per rank) and the compose testbed (a container per node) say so
    with pytest.raises(TopologyError, match=r"launch \(a process per rank, each its own host\)"):
        launch(topo, "rails.toml", WALL, ["python", "train.py"], ranks=None, compute_ms=0.0)
    path = tmp_path / "rails.toml"
    path.write_text(ai_zone(1, 2, 1, 4, rails=True))
    with pytest.raises(TopologyError, match=r"has a NIC per accelerator"):
        compose.generate(str(path), str(tmp_path / "testbed"))
    assert not (tmp_path / "testbed").exists()
