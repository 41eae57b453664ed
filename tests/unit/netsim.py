"""A hand-stepped fabric for the sans-IO cores: NICs and switches from a topology file on the
product's event engine (:mod:`rocev2_emu.runtime.engine`), stepped by hand without trio
(:mod:`tests.unit.hand_stepped`); links with their propagation delay, a seeded loss, and links
that can go down.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from rocev2_emu.nic.config import NicConfig
from rocev2_emu.nic.core import NicCore
from rocev2_emu.nic.driver import nic_node
from rocev2_emu.nic.ingress import IngressConfig
from rocev2_emu.runtime.engine import Node
from rocev2_emu.topology.model import Link, Topology
from rocev2_emu.wire.ethernet import ip_to_int
from switch.driver import switch_node
from switch.pipeline import SwitchCore
from tests.unit.hand_stepped import HandStepped


class _SimLink:
    """One direction of a link: its delay, a seeded loss, and whether it is down."""

    def __init__(self, sim: NetSim, link: Link) -> None:
        self.sim = sim
        self.link = link

    def fates(self, datagram: bytes, now: float) -> list[tuple[float, bytes]]:
        sim, link = self.sim, self.link
        if link.index in sim.down or (link.loss and sim.rng.random() < link.loss):
            sim.lost += 1
            return []
        return [(now + link.delay, datagram)]


class NetSim(HandStepped):
    def __init__(self, topo: Topology, *, seed: int = 0) -> None:
        super().__init__()
        self.topo = topo
        self.rng = random.Random(seed)
        self.nics: dict[str, NicCore] = {}
        self.switches: dict[str, SwitchCore] = {}
        self.lost = 0
        self.down: set[int] = set()  # link indices that are down
        nodes: dict[str, Node] = {}
        for sw in topo.switches:
            self.switches[sw.name] = SwitchCore(topo.switch_config(sw.name))
            nodes[sw.name] = self.engine.add(switch_node(self.switches[sw.name]))
        for h in topo.hosts:
            link, leaf = topo.host_link(h.name)
            self.nics[h.name] = NicCore(
                NicConfig(
                    ip=h.ip,
                    next_hop_mac=topo.mac_of(leaf.name, link),
                    vni=link.vni,
                    link_bps=link.rate_bps,
                    ingress=IngressConfig(rx_bps=h.rx_gbps * 1e9) if h.rx_gbps else None,
                ),
                rng=random.Random(seed * 1000 + h.index),
            )
            nodes[h.name] = self.engine.add(nic_node(self.nics[h.name]))
        self.nodes = list(nodes.values())
        for link in topo.links:
            a, b = (self._port(end, link) for end in (link.a, link.b))
            self.engine.connect(nodes[link.a], a, nodes[link.b], b, (None, None))
            for end, port in ((link.a, a), (link.b, b)):
                wire = nodes[end].wires[port]
                assert wire is not None
                wire.faulty = _SimLink(self, link)

    def _port(self, node: str, link: Link) -> int:
        return next(i for i, (lk, _) in enumerate(self.topo.nodes[node].ports) if lk is link)

    def run(
        self, until: Callable[[], bool], max_time: float = 5.0, max_steps: int = 5_000_000
    ) -> None:
        for _ in range(max_steps):
            if until():
                return
            if not self.step() or self.now > max_time:
                break
        if not until():
            raise AssertionError(f"condition not met by t={self.now * 1e6:.1f} us")

    def set_link(self, link: Link, up: bool) -> None:
        """Take a link down at both ends (switch ports lose their queues) or up again."""
        (self.down.discard if up else self.down.add)(link.index)
        for end in (link.a, link.b):
            if end in self.switches:
                self.switches[end].set_link(self._port(end, link), up, self.now)
        for name, sw in self.switches.items():  # the fabric's routing converges
            sw.set_routes(self.topo.routes_by_ip(name, frozenset(self.down)))

    def ip(self, host: str) -> int:
        return ip_to_int(self.topo.nodes[host].ip)
