"""The fabric a topology file describes: nodes, links, addresses and shortest-path ECMP routes.

:class:`Topology` is what :mod:`rocev2_emu.topology.file` parses a TOML file into; from
it :meth:`Topology.switch_config` builds what the switch pipeline needs and
:mod:`rocev2_emu.fabric.nodes` what the NICs need.  Node i (switches first, then hosts, in file
order) listens on 127.10.(i // 200).(i % 200 + 10) in local mode; host h's emulated address is
10.0.(h // 250).(h % 250 + 1).  Routes are every switch's egress ports on shortest paths to
each host (ECMP, RFC 2992), never through a host, recomputed around failed links.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rocev2_emu.cc import PROFILES, DcqcnParams
from rocev2_emu.server.crossbar import PRESETS, IntraServerConfig
from rocev2_emu.topology.nodes import PAYLOADS, Link, Node, NodeKind, TopologyError
from rocev2_emu.topology.paths import shortest_path_routes
from rocev2_emu.topology.routes import RouteTable
from rocev2_emu.wire.ethernet import ip_to_int, mac_for_ip
from switch.config import EcnThresholds, PortConfig, SwitchConfig
from switch.mmu import MmuConfig, pfc_headroom

__all__ = [  # the graph's elements and its routes, where the topology's users find them
    "PAYLOADS",
    "Link",
    "Node",
    "NodeKind",
    "Topology",
    "TopologyError",
    "dcqcn_overrides",
    "dcqcn_params",
    "refuse_split_servers",
    "shortest_path_routes",
]


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
