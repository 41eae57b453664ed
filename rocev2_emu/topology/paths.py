"""Shortest-path ECMP routes (RFC 2992) over a topology's graph: every switch's egress ports
on shortest paths to each host, never through a host, over the links that are up.

Grows with the switches and the hosts' attachment switches (one breadth-first search for all
of them at once), not with switches x hosts: each switch's table keeps its commonest ports
once (:class:`~rocev2_emu.topology.routes.RouteTable`).
"""

from __future__ import annotations

from collections import deque

from rocev2_emu.topology.nodes import Node, NodeKind, TopologyError
from rocev2_emu.topology.routes import RouteTable


def shortest_path_routes(
    nodes: dict[str, Node], path: str, down: frozenset[int] = frozenset()
) -> dict[str, RouteTable[str]]:
    """Per switch and host: the egress ports on shortest paths (ECMP), never through a host,
    over the links not in ``down``.  A host no longer reachable gets no ports.  Each switch's
    table holds its commonest ports once (:class:`~rocev2_emu.topology.routes.RouteTable`).

    A host on one link is reached through its switch, so every other switch routes it as it
    routes that switch: the switches hosts hang off are searched for all at once
    (:func:`_toward_switches`), not once per host, and each switch takes a switch's hosts in one
    step (:func:`_hosts_behind`)."""
    # each switch's routes as runs of hosts that take the same ports, in the hosts' order: a
    # run per attachment switch, not a dict entry per host (switches x hosts: 42 M entries
    # for the 24 576-accelerator cluster; RouteTable.of_runs keeps only the exceptions)
    routes: dict[str, list[tuple[list[str], tuple[int, ...]]]] = {
        s: [] for s, n in nodes.items() if n.kind is NodeKind.SWITCH
    }
    behind = _hosts_behind(nodes, down)
    graph = _switch_graph(nodes, down)
    done: set[str] = set()
    toward = _toward_switches(graph, [a for a in behind if a in graph])
    for host in (n for n in nodes.values() if n.kind is NodeKind.HOST):
        attach = _attachment(host, down)
        if attach is not None:
            if attach in done:
                continue
            done.add(attach)
            names = behind[attach]
            # a host's attachment is a switch, or the other host of a pair joined by their link
            table = toward[attach] if attach in graph else _toward_host(nodes, graph, attach, down)
            for sw, runs in routes.items():
                if sw == attach:
                    for name in names:
                        link = nodes[name].ports[0][0]
                        own = tuple(i for i, (lk, _) in enumerate(nodes[sw].ports) if lk is link)
                        runs.append(([name], own))
                elif (ports := table.get(sw)) is not None:
                    runs.append((names, ports))
                elif not down:
                    raise TopologyError(f"{path}: [[switch]] {sw}: cannot reach host {names[0]}")
                else:
                    runs.append((names, ()))
            continue
        dist = _distances(nodes, host.name, down)
        for sw, runs in routes.items():
            if sw not in dist:
                if not down:
                    raise TopologyError(f"{path}: [[switch]] {sw}: cannot reach host {host.name}")
                runs.append(([host.name], ()))
                continue
            ports = tuple(
                i
                for i, (link, peer) in enumerate(nodes[sw].ports)
                if dist.get(peer) == dist[sw] - 1
                and link.index not in down
                and (nodes[peer].kind is NodeKind.SWITCH or peer == host.name)
            )
            runs.append(([host.name], ports))
    hosts = tuple(n.name for n in nodes.values() if n.kind is NodeKind.HOST)
    members = frozenset(hosts)
    return {sw: RouteTable.of_runs(runs, hosts, members) for sw, runs in routes.items()}


def _attachment(host: Node, down: frozenset[int]) -> str | None:
    """The node a host on one working link hangs off (None: several links, or it is down)."""
    if len(host.ports) == 1 and host.ports[0][0].index not in down:
        return host.ports[0][1]
    return None


def _hosts_behind(nodes: dict[str, Node], down: frozenset[int]) -> dict[str, list[str]]:
    """The hosts on one working link, by the node they hang off, in file order."""
    behind: dict[str, list[str]] = {}
    for n in nodes.values():
        if n.kind is NodeKind.HOST and (attach := _attachment(n, down)) is not None:
            behind.setdefault(attach, []).append(n.name)
    return behind


def _distances(nodes: dict[str, Node], start: str, down: frozenset[int]) -> dict[str, int]:
    """Hops from ``start`` over links not in ``down``, never through a host but ``start``."""
    dist = {start: 0}
    queue = deque([start])
    while queue:
        cur = queue.popleft()
        if nodes[cur].kind is NodeKind.HOST and cur != start:
            continue
        for link, peer in nodes[cur].ports:
            if peer not in dist and link.index not in down:
                dist[peer] = dist[cur] + 1
                queue.append(peer)
    return dist


def _switch_graph(nodes: dict[str, Node], down: frozenset[int]) -> dict[str, list[tuple[int, str]]]:
    """Each switch's ports to another switch over links not in ``down``: (port, peer)."""
    return {
        sw: [
            (i, peer)
            for i, (link, peer) in enumerate(n.ports)
            if nodes[peer].kind is NodeKind.SWITCH and link.index not in down
        ]
        for sw, n in nodes.items()
        if n.kind is NodeKind.SWITCH
    }


def _toward_host(
    nodes: dict[str, Node],
    graph: dict[str, list[tuple[int, str]]],
    start: str,
    down: frozenset[int],
) -> dict[str, tuple[int, ...]]:
    """Each switch's ports on shortest paths to host ``start`` through switches only
    (``graph``: :func:`_switch_graph`); a switch that cannot reach it is not in it."""
    dist = _distances(nodes, start, down)
    return {
        sw: tuple(i for i, peer in ports if dist.get(peer) == dist[sw] - 1)
        for sw, ports in graph.items()
        if sw in dist
    }


def _toward_switches(
    graph: dict[str, list[tuple[int, str]]], starts: list[str]
) -> dict[str, dict[str, tuple[int, ...]]]:
    """Per switch of ``starts``: every other switch's ports on shortest paths to it through
    switches only (``graph``: :func:`_switch_graph`); a switch that cannot reach it is not in
    it.

    One breadth-first search for all of ``starts`` at once, on bit sets (an integer per switch,
    a bit per start): a round ORs each switch's set with its neighbours', so round ``d`` finds
    the starts ``d`` hops away.  A port leads nearer to the starts its peer has one hop closer;
    the starts are then split into classes that take the same ports - a handful per switch on a
    regular fabric - instead of one search and one port scan per start (k = 16: 128)."""
    order = list(graph)
    at = {sw: k for k, sw in enumerate(order)}
    peers = [[at[peer] for _, peer in graph[sw]] for sw in order]
    reach = [0] * len(order)
    for b, sw in enumerate(starts):
        reach[at[sw]] |= 1 << b
    rings = [[m] for m in reach]  # rings[k][d]: the starts d hops from switch k
    while True:
        grown = []
        for k, near in enumerate(peers):
            m = reach[k]
            for j in near:
                m |= reach[j]
            grown.append(m)
        if grown == reach:
            break
        for ring, m, before in zip(rings, grown, reach, strict=True):
            ring.append(m & ~before)
        reach = grown
    toward: dict[str, dict[str, tuple[int, ...]]] = {sw: {} for sw in starts}
    for k, sw in enumerate(order):
        ring = rings[k]
        classes: dict[int, list[int]] = {reach[k] & ~ring[0]: []}
        for (i, _), j in zip(graph[sw], peers[k], strict=True):
            there = rings[j]
            nearer = 0
            for d in range(1, len(ring)):
                nearer |= ring[d] & there[d - 1]
            if nearer:
                split: dict[int, list[int]] = {}
                for cls, ports in classes.items():
                    if inside := cls & nearer:
                        split[inside] = [*ports, i]
                    if outside := cls & ~nearer:
                        split[outside] = ports
                classes = split
        for cls, ports in classes.items():
            tup = tuple(ports)
            while cls:
                low = cls & -cls
                toward[starts[low.bit_length() - 1]][sw] = tup
                cls ^= low
    return toward
