"""Which process of an exact run hosts which nodes: one node each, or groups over ``--workers``,
and how a process is named.  Every process (and a swarm stack's writer) computes the same
groups from the topology, so each knows where the others are.
"""

from __future__ import annotations

from rocev2_emu.topology.model import NodeKind, Topology


def process_groups(topo: Topology, workers: int | None = None) -> list[list[str]]:
    """The nodes each process of an exact run hosts: one node each (``workers`` None), or at
    most ``workers`` processes; the hosts of one server (a NIC per accelerator, ``server`` in
    the topology) always share one, as they share the server's fabric.  With workers, the edge
    groups - a switch with the hosts linked to it (a host without a switch alone), or a server's
    hosts - are cut in topology order into runs of about equal size, so neighbours (a pod's
    leaves, a ring's next ranks) share a process; then, tier by tier away from them, each switch
    in no edge group (a spine, an aggregation or core switch, a leaf whose hosts are all in
    servers: a rail) joins the process holding most of its neighbours of the tiers before (on a
    tie, the one with the fewest nodes).
    Every process computes the same groups from the topology, so each knows where the others
    are."""
    if workers is None:
        together = {h: hosts for hosts in topo.servers.values() for h in hosts}
        return [together.get(n, [n]) for n in topo.nodes if together.get(n, [n])[0] == n]
    if workers < 1:
        raise ValueError(f"--workers {workers}: at least one process")
    edges: dict[str, list[str]] = {}
    lone: list[str] = []
    for node in topo.nodes.values():
        if node.kind is NodeKind.HOST:
            key = node.name
            if node.server:
                key = "server " + node.server
            elif node.ports:
                _, peer = topo.host_link(node.name)
                key = peer.name if peer.kind is NodeKind.SWITCH else key
            edges.setdefault(key, []).append(node.name)
        elif any(
            topo.nodes[peer].kind is NodeKind.HOST and not topo.nodes[peer].server
            for _, peer in node.ports
        ):
            edges.setdefault(node.name, []).insert(0, node.name)
        else:
            lone.append(node.name)
    runs = list(edges.values()) or [[lone.pop(0)]]  # a fabric of switches only: one seeds
    bins: list[list[str]] = [[] for _ in range(min(workers, len(runs)))]
    total, placed = sum(len(g) for g in runs), 0
    for group in runs:  # bin k takes the groups that start before k/n of the nodes
        bins[min(len(bins) - 1, placed * len(bins) // total)].extend(group)
        placed += len(group)
    home = {name: k for k, b in enumerate(bins) for name in b}
    while lone:  # tier by tier: those next to what is placed, against that placement
        tier = [n for n in lone if any(p in home for _, p in topo.nodes[n].ports)] or lone[:1]
        counts = {name: [0] * len(bins) for name in tier}
        for name in tier:
            for _, far in topo.nodes[name].ports:
                if far in home:
                    counts[name][home[far]] += 1
        for name in tier:
            k = max(range(len(bins)), key=lambda k: (counts[name][k], -len(bins[k]), -k))
            bins[k].append(name)
            home[name] = k
            lone.remove(name)
    order = {name: i for i, name in enumerate(topo.nodes)}
    return [sorted(b, key=order.__getitem__) for b in bins if b]


def process_name(group: list[str]) -> str:
    """How the run names a process: its nodes, comma-separated."""
    return ",".join(group)
