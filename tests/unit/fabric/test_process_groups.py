"""How an exact run with ``--workers N`` places its nodes in processes
(rocev2_emu/fabric/exact.py ``process_groups``): whole edge groups (a switch with its hosts) in
topology order, switches without hosts beside most of their neighbours, every node in exactly
one process, the same answer in every process; a node process asked to host what is not one of
them says so; a flows job opens its flows in runs whose sources share a process."""

from __future__ import annotations

import tomllib
from dataclasses import asdict
from typing import Any

import pytest

from rocev2_emu.fabric.agent import FlowSpec
from rocev2_emu.fabric.agent_server import MAX_OPEN_FLOWS, OpenFlows, open_flows_on
from rocev2_emu.fabric.exact_node import run_node_group
from rocev2_emu.fabric.layout import by_process, open_batches
from rocev2_emu.fabric.node_procs import READY_PER_NODE, READY_TIMEOUT, ready_deadline
from rocev2_emu.topology.file import parse
from rocev2_emu.topology.generate import Servers, fat_tree, leaf_spine, single_switch
from rocev2_emu.topology.model import NodeKind
from rocev2_emu.topology.processes import process_groups, process_name


def _leaf_spine() -> Any:
    return parse(tomllib.loads(leaf_spine(2, 4, 2)), "leaf-spine.toml")


def test_without_workers_every_node_is_its_own_process() -> None:
    topo = _leaf_spine()
    assert process_groups(topo) == [[name] for name in topo.nodes]


@pytest.mark.parametrize("workers", [1, 2, 3, 4, 5, 40])
def test_workers_hold_whole_edge_groups_every_node_once_and_balanced(workers: int) -> None:
    topo = _leaf_spine()
    groups = process_groups(topo, workers)
    placed = [name for group in groups for name in group]
    assert sorted(placed) == sorted(topo.nodes)  # every node, once
    assert len(groups) == min(workers, 4)  # 4 leaf groups: at most 4 processes
    home = {name: i for i, group in enumerate(groups) for name in group}
    for leaf in ("leaf0", "leaf1", "leaf2", "leaf3"):  # a leaf and its two hosts together
        peers = [peer for _, peer in topo.nodes[leaf].ports]
        hosts = [peer for peer in peers if topo.nodes[peer].kind is NodeKind.HOST]
        assert len(hosts) == 2
        assert {home[h] for h in hosts} == {home[leaf]}
    spines = {home["spine0"], home["spine1"]}
    leaves = {home[f"leaf{i}"] for i in range(4)}
    assert spines <= leaves  # a spine beside leaves, never a process of its own
    order = list(topo.nodes)
    assert all(g == sorted(g, key=order.index) for g in groups)  # in the topology's order
    assert process_groups(topo, workers) == groups  # what every process computes alike


def test_two_workers_split_the_leaf_spine_in_halves() -> None:
    groups = process_groups(_leaf_spine(), 2)
    assert [process_name(g) for g in groups] == [
        "spine0,leaf0,leaf1,h0,h1,h2,h3",
        "spine1,leaf2,leaf3,h4,h5,h6,h7",
    ]


def test_a_fat_tree_splits_by_pods_and_shares_its_cores() -> None:
    topo = parse(tomllib.loads(fat_tree(8)), "fat-tree.toml")
    for workers in (2, 4):
        groups = process_groups(topo, workers)
        assert [len(g) for g in groups] == [208 // workers] * workers
        home = {name: i for i, group in enumerate(groups) for name in group}
        for pod in range(8):  # a pod's aggregation and edge switches and hosts together
            members = [n for n in topo.nodes if n.startswith((f"agg{pod}_", f"edge{pod}_"))]
            assert len({home[n] for n in members}) == 1
        cores = [sum(n.startswith("core") for n in g) for g in groups]
        assert cores == [16 // workers] * workers


def test_one_switch_and_its_hosts_stay_one_process_however_many_workers() -> None:
    topo = parse(tomllib.loads(single_switch(4)), "single-switch.toml")
    assert process_groups(topo, 4) == [list(topo.nodes)]


def test_a_node_process_refuses_what_is_not_one_of_the_runs_processes() -> None:
    topo = _leaf_spine()
    with pytest.raises(ValueError, match="no node named 'h99'"):
        run_node_group(topo, ["h99"], ("127.0.0.1", 1), workers=2)
    with pytest.raises(ValueError, match=r"h0,h1: a process of this run hosts one of \["):
        run_node_group(topo, ["h0", "h1"], ("127.0.0.1", 1), workers=2)
    with pytest.raises(ValueError, match=r"h0,h1: a process of this run hosts h0$"):
        run_node_group(topo, ["h0", "h1"], ("127.0.0.1", 1))
    servers = parse(tomllib.loads(single_switch(2, servers=Servers(2, "nvlink", True))), "s.toml")
    with pytest.raises(ValueError, match=r"h1: a process of this run hosts h0,h1$"):
        run_node_group(servers, ["h1"], ("127.0.0.1", 1))  # a server's hosts: one process
    with pytest.raises(ValueError, match="at least one process"):
        process_groups(topo, 0)


def test_a_process_of_many_nodes_raises_its_open_file_limit_or_says_why_not(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """672 nodes in one process (the k = 16 fat-tree on 2 workers) hold about 2 080 sockets:
    a soft limit of 1 024 is raised to what they need; a hard limit below that is raised
    where the process may (root), else one line says why the process cannot start."""
    import resource

    from rocev2_emu.fabric import exact_node

    limits = {"now": (1024, 4096)}
    privileged = {"yes": True}

    def setrlimit(_: int, lim: tuple[int, int]) -> None:
        if lim[1] > limits["now"][1] and not privileged["yes"]:
            raise ValueError("not allowed to raise maximum limit")
        limits.update(now=lim)

    monkeypatch.setattr(resource, "getrlimit", lambda _: limits["now"])
    monkeypatch.setattr(resource, "setrlimit", setrlimit)
    exact_node.enough_files(672, metrics=True)
    assert limits["now"] == (2080, 4096)
    exact_node.enough_files(8, metrics=True)  # enough already: unchanged
    assert limits["now"] == (2080, 4096)
    limits["now"] = (1024, 1024)
    exact_node.enough_files(672, metrics=True)
    assert limits["now"] == (2080, 2080)
    limits["now"], privileged["yes"] = (1024, 1024), False
    with pytest.raises(ValueError, match=r"host 672 nodes and needs about 2080 open files"):
        exact_node.enough_files(672, metrics=True)


def test_a_flows_job_opens_runs_of_flows_whose_sources_share_a_process() -> None:
    """``open_batches``: the flows stay in their order, a batch is a run of sources in one
    process, at most MAX_OPEN_FLOWS long; one process per node cuts at every new source."""
    topo = _leaf_spine()
    groups = process_groups(topo, 2)
    names = [process_name(g) for g in groups]
    hosts = [h.name for h in topo.hosts]  # h0 - h3 in the first process, h4 - h7 in the second
    first, second = hosts[:4], hosts[4:]
    assert all(h in groups[0] for h in first) and all(h in groups[1] for h in second)
    srcs = [first[0], first[1], second[0], second[1], second[2], first[2]]
    flows = [
        FlowSpec(i, src, hosts[-1] if src in first else hosts[0], 64) for i, src in enumerate(srcs)
    ]
    batches = open_batches(flows, names)
    assert [[f.id for f in b] for b in batches] == [[0, 1], [2, 3, 4], [5]]
    alone = open_batches(flows, [process_name([n]) for n in topo.nodes])
    assert [[f.id for f in b] for b in alone] == [[0], [1], [2], [3], [4], [5]]
    many = [FlowSpec(i, first[i % 4], hosts[-1], 64) for i in range(MAX_OPEN_FLOWS + 3)]
    assert [len(b) for b in open_batches(many, names)] == [MAX_OPEN_FLOWS, 3]


def test_requests_to_many_nodes_go_to_each_process_32_nodes_at_a_time() -> None:
    topo = parse(tomllib.loads(fat_tree(8)), "ft8.toml")
    names = [process_name(g) for g in process_groups(topo, 2)]
    hosts = {h.name for h in topo.hosts}
    asks = by_process(names, hosts)
    assert [len(a) for a in asks] == [32, 32, 32, 32]  # 64 hosts in each process
    assert sorted(n for a in asks for n in a) == sorted(hosts)
    homes = {n: i for i, name in enumerate(names) for n in name.split(",")}
    assert all(len({homes[n] for n in a}) == 1 for a in asks)
    assert by_process(names, {"h3"}) == [["h3"]]


async def test_open_flows_refuses_a_source_that_is_not_a_host_of_the_process() -> None:
    flow = {"spec": asdict(FlowSpec(0, "h0", "h1", 64)), "dst": "127.10.0.2"}
    with pytest.raises(ValueError, match=r"flows\[0\]: 'h0' is not a host of this process"):
        await open_flows_on({}, OpenFlows([flow]))
    with pytest.raises(ValueError, match=r"flows\[1\]\.spec\.size: missing"):
        await open_flows_on(
            {}, OpenFlows([flow, {"spec": {"id": 1, "src": "h0", "dst": "h1"}, "dst": "x"}])
        )


def test_the_ready_deadline_grows_with_the_nodes_the_processes_host() -> None:
    """Six workers of the 24 576-accelerator cluster (26 274 nodes) took more than the fixed
    60 s to read the file and build their nodes on two cores; a fabric of a few nodes keeps
    about a minute."""
    small = ready_deadline(["sw0", "h0", "h1"])
    assert small == READY_TIMEOUT + 3 * READY_PER_NODE
    workers = [",".join(f"n{w}_{k}" for k in range(4379)) for w in range(6)]
    assert ready_deadline(workers) == READY_TIMEOUT + 6 * 4379 * READY_PER_NODE > 300
