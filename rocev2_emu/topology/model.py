"""The fabric a topology file describes: nodes, links, addresses and shortest-path ECMP routes.

:class:`Topology` is what :mod:`rocev2_emu.topology.file` parses a TOML file into; from
it :meth:`Topology.switch_config` builds what the switch pipeline needs and
:mod:`rocev2_emu.fabric.nodes` what the NICs need.  Node i (switches first, then hosts, in file
order) listens on 127.10.(i // 200).(i % 200 + 10) in local mode; host h's emulated address is
10.0.(h // 250).(h % 250 + 1).  Routes are every switch's egress ports on shortest paths to
each host (ECMP, RFC 2992), never through a host, recomputed around failed links.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from rocev2_emu.cc import PROFILES, DcqcnParams
from rocev2_emu.server.crossbar import PRESETS, IntraServerConfig
from rocev2_emu.topology.routes import RouteTable
from rocev2_emu.wire.ethernet import ip_to_int, mac_for_ip
from switch.config import EcnThresholds, PortConfig, SwitchConfig
from switch.mmu import MmuConfig, pfc_headroom


class TopologyError(ValueError):
    """A topology file that cannot be used; the message names file, key and value."""


PAYLOADS = ("real", "none")  # [fabric] payload, --payload: real bytes, or timing-only


@dataclass(slots=True)
class Link:
    index: int
    a: str
    b: str
    rate_bps: float
    delay: float  # emulated seconds, one way
    loss: float

    @property
    def vni(self) -> int:
        return self.index + 1


class NodeKind(StrEnum):
    """What a node is: a host (its NIC and ranks) or a switch; its value is the topology
    file's table name (``[[host]]``, ``[[switch]]``) and the metrics' ``role`` label."""

    HOST = "host"
    SWITCH = "switch"


@dataclass(slots=True)
class Node:
    name: str
    kind: NodeKind
    index: int  # position among all nodes
    address: str  # local-mode UDP address
    ranks: int = 0
    rx_gbps: float = 0.0  # hosts: how fast the host drains its NIC (0: as fast as the link)
    ip: str = ""  # hosts: emulated IPv4 (the GID)
    buffer_bytes: int = 0  # switches: their own buffer (0: the fabric's [buffer] size_bytes)
    buffer_mode: str = ""  # switches: their own buffer mode ("": the fabric's [buffer] mode)
    server: str = ""  # hosts: the server whose accelerator's NIC this is ("": a server of its own)
    ports: list[tuple[Link, str]] = field(default_factory=list)  # (link, neighbour name)


@dataclass(slots=True)
class Topology:
    path: str
    name: str
    tdf: float
    seed: int
    mtu: int
    nodes: dict[str, Node]
    links: list[Link]
    mmu: MmuConfig
    pfc: dict[str, Any]
    ecn: dict[str, Any]
    dcqcn: dict[str, Any]
    transport: dict[str, Any]
    routes: dict[str, RouteTable[str]]  # switch -> host -> egress ports
    subnet: str = ""  # "", a CIDR, or "dns" (addresses are names until resolve_names)
    batch_io: bool = True  # node processes batch their datagrams (UDP GSO/GRO)
    ecmp: str = "5-tuple"  # how switches pick among equal-cost ports (switch.config.ECMP_MODES)
    server: IntraServerConfig = PRESETS["nvlink"]  # what joins the ranks of a server ([server])
    # every server's hosts (its accelerators' NICs) in file order, servers by their first host
    servers: dict[str, list[str]] = field(default_factory=dict)
    # "real": frames carry their bytes; "none": timing-only, their headers only (PAYLOADS)
    payload: str = "real"
    # each node's emulated IPv4 as an integer (-1: a switch), filled by routes_by_ip
    _host_ips: dict[str, int] = field(default_factory=dict, init=False, repr=False, compare=False)
    # every host's IP, in order and as a set, shared by the switches' tables (switch_routes)
    _ip_keys: tuple[int, ...] = field(default=(), init=False, repr=False, compare=False)
    _ip_set: frozenset[int] = field(default=frozenset(), init=False, repr=False, compare=False)
    # (node, link index) -> the node's port on that link, filled a node at a time by port_of
    _ports: dict[tuple[str, int], int] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )
    # the addresses more than one node has, found once by shares_address (a set of at most
    # one entry a process: grows with the processes of a swarm stack's workers, not the nodes)
    _shared: frozenset[str] | None = field(default=None, init=False, repr=False, compare=False)

    @property
    def hosts(self) -> list[Node]:
        return [n for n in self.nodes.values() if n.kind is NodeKind.HOST]

    @property
    def switches(self) -> list[Node]:
        return [n for n in self.nodes.values() if n.kind is NodeKind.SWITCH]

    def shares_address(self, name: str) -> bool:
        """Whether node ``name``'s address is another node's too: the nodes of a swarm stack's
        worker are all found at its task (their names its aliases), and the process there
        answers for each by name (``for_nodes``), not at a control port of each node's own."""
        if self._shared is None:
            seen: set[str] = set()
            shared: set[str] = set()
            for node in self.nodes.values():
                (shared if node.address in seen else seen).add(node.address)
            self._shared = frozenset(shared)
        return self.nodes[name].address in self._shared

    def server_of(self, host: str) -> str:
        """The server a host belongs to: its ``server`` key, or its own name (a host alone is
        a server whose accelerators share its NIC)."""
        return self.nodes[host].server or host

    def server_hosts(self, host: str) -> list[str]:
        """The hosts of ``host``'s server (``[host]`` for a host alone)."""
        return self.servers[self.server_of(host)]

    def port_mac(self, switch: str, port: int) -> bytes:
        i = self.nodes[switch].index
        return bytes((0x02, 0x01, i >> 8 & 0xFF, i & 0xFF, port >> 8 & 0xFF, port & 0xFF))

    def mac_of(self, name: str, link: Link) -> bytes:
        """The MAC a node uses on ``link``."""
        node = self.nodes[name]
        if node.kind is NodeKind.HOST:
            return mac_for_ip(ip_to_int(node.ip))
        return self.port_mac(name, self.port_of(name, link))

    def switch_config(self, name: str) -> SwitchConfig:
        node = self.nodes[name]
        lossless = bool(self.pfc["enabled"])
        ports = []
        for i, (link, peer) in enumerate(node.ports):
            ecn = None
            if "kmin_kb" in self.ecn:
                ecn = EcnThresholds(
                    int(self.ecn["kmin_kb"] * 1000),
                    int(self.ecn["kmax_kb"] * 1000),
                    float(self.ecn.get("pmax", 0.2)),
                )
            ports.append(
                PortConfig(
                    i,
                    link.vni,
                    link.rate_bps,
                    self.port_mac(name, i),
                    self.mac_of(peer, link),
                    peer,
                    ecn,
                    # a lossless port's headroom as its link needs it; none without PFC
                    pfc_headroom(link.rate_bps, link.delay, self.mtu) if lossless else 0,
                )
            )
        table = self.switch_routes(name)
        mmu = self.mmu
        if node.buffer_bytes or node.buffer_mode:  # a deep-buffer spine, say
            mmu = MmuConfig(
                node.buffer_bytes or mmu.buffer_bytes,
                mmu.reserve_bytes,
                mmu.headroom_bytes,
                mmu.alpha,
                mmu.xoff_bytes,
                mmu.xon_offset_bytes,
                node.buffer_mode or mmu.mode,
            )
        return SwitchConfig(
            name=name,
            ports=ports,
            routes=table.other,
            mmu=mmu,
            pfc_enabled=bool(self.pfc["enabled"]),
            lossless=frozenset(self.pfc["lossless_priorities"]),
            pfc_quanta=self.pfc["quanta"],
            ecn_enabled=bool(self.ecn["enabled"]),
            ecn_priorities=frozenset(self.ecn["priorities"]),
            watchdog_detect=self.pfc["watchdog_detect_ms"] / 1e3,
            watchdog_restore=self.pfc["watchdog_restore_ms"] / 1e3,
            watchdog_action=self.pfc["watchdog_action"],
            seed=self.seed + node.index,
            ecmp=self.ecmp,
            timing_only=self.timing_only,
            default_route=table.default,
            hosts=table.members,
        )

    @property
    def timing_only(self) -> bool:
        """Frames carry their headers only (``payload = "none"``): every emulated figure is
        the run's with real bytes, no value is checked."""
        return self.payload == "none"

    def routes_by_ip(
        self, switch: str, down: frozenset[int] = frozenset()
    ) -> dict[int, tuple[int, ...]]:
        """The switch's routes with the links in ``down`` removed, as a routing protocol
        would converge to after those links failed."""
        if down:
            table = shortest_path_routes(self.nodes, self.path, down)[switch]
        else:
            table = self.routes[switch]
        ips = self._ips()
        return dict(zip(map(ips.__getitem__, table), table.values(), strict=True))

    def switch_routes(self, switch: str) -> RouteTable[int]:
        """The switch's routes by host IP, as its table holds them (the default, the hosts
        reached otherwise): what its pipeline is configured with."""
        table = self.routes[switch]
        ips = self._ips()
        if len(self._ip_set) != len(table.keys_):
            self._ip_keys = tuple(ips[h] for h in table.keys_)
            self._ip_set = frozenset(self._ip_keys)
        other = {ips[h]: ports for h, ports in table.other.items()}
        return RouteTable(self._ip_keys, self._ip_set, table.default, other)

    def _ips(self) -> dict[str, int]:
        if len(self._host_ips) != len(self.nodes):  # once: every node's, a switch's unused
            self._host_ips = {n.name: ip_to_int(n.ip) if n.ip else -1 for n in self.nodes.values()}
        return self._host_ips

    def link_seed(self, link: Link) -> int:
        """The seed of ``link``'s fault injection: distinct per link, fixed by the topology."""
        return self.seed * 1000 + link.index

    def link_between(self, a: str, b: str) -> Link:
        """The link between nodes ``a`` and ``b`` (the first, if several); a TopologyError
        names a pair that is no link."""
        link = next((lk for lk in self.links if {lk.a, lk.b} == {a, b}), None)
        if link is None:
            raise TopologyError(f"{self.path}: no link between {a!r} and {b!r}")
        return link

    def port_of(self, name: str, link: Link) -> int:
        """The index of the port of node ``name`` on ``link``."""
        ports = self.nodes[name].ports
        i = self._ports.get((name, link.index), -1)
        if not 0 <= i < len(ports) or ports[i][0] is not link:  # first asked, or ports changed
            self._ports.update({(name, lk.index): j for j, (lk, _) in enumerate(ports)})
            i = next(j for j, (lk, _) in enumerate(ports) if lk is link)
        return i

    def host_link(self, name: str) -> tuple[Link, Node]:
        """A host's one link and the switch (or host) at its other end."""
        node = self.nodes[name]
        link, peer = node.ports[0]
        return link, self.nodes[peer]


def refuse_split_servers(
    topo: Topology,
    names: list[str] | None = None,
    runner: str = "a process per node (the wall clock, the compose testbed)",
) -> None:
    """For a process per node (the wall clock, the compose testbed): refuse the hosts
    (``names``: these; None: any) of a server of a NIC per accelerator, whose fabric needs its
    hosts in one process (an exact run places them so); ``runner`` names what cannot."""
    for server, hosts in topo.servers.items():
        if len(hosts) > 1 and (names is None or set(hosts) & set(names)):
            raise TopologyError(
                f"{topo.path}: server {server!r} ({', '.join(hosts)}) has a NIC per accelerator; "
                "its hosts share its fabric in one process, which an exact run gives them "
                f"(--clock exact, or --virtual); {runner} cannot"
            )


def dcqcn_overrides(section: dict[str, Any]) -> dict[str, Any]:
    """The DCQCN parameters a topology's [dcqcn] section sets beyond its profile."""
    return {k: v for k, v in section.items() if k in DcqcnParams.__dataclass_fields__}


def dcqcn_params(topo: Topology) -> DcqcnParams | None:
    """The NICs' DCQCN parameters, or None when the topology turns DCQCN off."""
    if not topo.dcqcn["enabled"]:
        return None
    return PROFILES[topo.dcqcn["profile"]].with_overrides(**dcqcn_overrides(topo.dcqcn))


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
