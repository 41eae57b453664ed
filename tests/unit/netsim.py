"""A hand-stepped fabric for the sans-IO cores: NICs and switches from a topology file, links
with their propagation delay, a seeded loss, and time advanced to the next event."""

from __future__ import annotations

import heapq
import random
from collections.abc import Callable

from rocev2_emu.fabric.topology import Link, Topology
from rocev2_emu.nic.core import NicConfig, NicCore
from rocev2_emu.nic.ingress import IngressConfig
from rocev2_emu.wire.ethernet import ip_to_int
from switch.pipeline import SwitchCore


class NetSim:
    def __init__(self, topo: Topology, *, seed: int = 0) -> None:
        self.topo = topo
        self.now = 0.0
        self.rng = random.Random(seed)
        self.heap: list[tuple[float, int, str, int, bytes]] = []
        self._seq = 0
        self.nics: dict[str, NicCore] = {}
        self.switches: dict[str, SwitchCore] = {}
        self.lost = 0
        # (node, port) -> (link, peer node, peer port)
        self.wires: dict[tuple[str, int], tuple[Link, str, int]] = {}
        for node in topo.nodes.values():
            for port, (link, peer) in enumerate(node.ports):
                peer_port = next(
                    i for i, (lk, _) in enumerate(topo.nodes[peer].ports) if lk is link
                )
                self.wires[node.name, port] = (link, peer, peer_port)
        for sw in topo.switches:
            self.switches[sw.name] = SwitchCore(topo.switch_config(sw.name))
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
        self.down: set[int] = set()  # link indices that are down

    def _send(self, node: str, port: int, data: bytes) -> None:
        link, peer, peer_port = self.wires[node, port]
        if link.index in self.down or (link.loss and self.rng.random() < link.loss):
            self.lost += 1
            return
        self._seq += 1
        heapq.heappush(self.heap, (self.now + link.delay, self._seq, peer, peer_port, data))

    def _pump(self) -> None:
        for name, nic in self.nics.items():
            nic.handle_timer(self.now)
            while (d := nic.next_datagram(self.now)) is not None:
                self._send(name, 0, bytes(d))
        for name, sw in self.switches.items():
            sw.handle_timer(self.now)
            for port, d in sw.transmit(self.now):
                self._send(name, port, d)

    def _next_time(self) -> float | None:
        times = [t for n in self.nics.values() if (t := n.get_timer()) is not None]
        times += [t for s in self.switches.values() if (t := s.get_timer()) is not None]
        if self.heap:
            times.append(self.heap[0][0])
        return min(times) if times else None

    def step(self) -> bool:
        self._pump()
        t = self._next_time()
        if t is None:
            return False
        self.now = max(self.now, t)
        while self.heap and self.heap[0][0] <= self.now:
            _, _, node, port, data = heapq.heappop(self.heap)
            if node in self.nics:
                self.nics[node].receive_datagram(data, self.now)
            else:
                self.switches[node].receive(port, data, self.now)
        return True

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

    def advance_to(self, t: float) -> None:
        while True:
            self._pump()
            nt = self._next_time()
            if nt is None or nt > t:
                self.now = max(self.now, t)
                return
            self.step()

    def set_link(self, link: Link, up: bool) -> None:
        """Take a link down at both ends (switch ports lose their queues) or up again."""
        (self.down.discard if up else self.down.add)(link.index)
        for end in (link.a, link.b):
            if end in self.switches:
                port = next(i for i, (lk, _) in enumerate(self.topo.nodes[end].ports) if lk is link)
                self.switches[end].set_link(port, up, self.now)
        for name, sw in self.switches.items():  # the fabric's routing converges
            sw.set_routes(self.topo.routes_by_ip(name, frozenset(self.down)))

    def ip(self, host: str) -> int:
        return ip_to_int(self.topo.nodes[host].ip)
