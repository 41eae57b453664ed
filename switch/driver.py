"""The switch's drivers: the one pump loop (:mod:`rocev2_emu.runtime.pump`) around the
sans-IO pipeline (:class:`SwitchDriver`), or a node of the virtual-time event engine
(:mod:`rocev2_emu.runtime.engine`, :class:`EngineSwitch`), which hands each frame to its port.

Every port is a link to one neighbour; all of them share the switch's one UDP socket (an
unconnected one: each port sends to its own peer address) and the VXLAN VNI of an arriving
datagram names the ingress port, which only that link's peer may send to: a datagram from any
other address is dropped and counted (``not_from_peer``).  Each port's frames leave through its
link's propagation delay and faults.
"""

from __future__ import annotations

from rocev2_emu.runtime.clock import BEHIND_MARKS, DilatedClock
from rocev2_emu.runtime.engine import Engine, Node
from rocev2_emu.runtime.link import LinkFaults
from rocev2_emu.runtime.ports import DatagramPort, EnginePort
from rocev2_emu.runtime.pump import CATCHUP_WALL_SECONDS, Pump
from switch.pipeline import SwitchCore


class SwitchDriver(Pump):
    def __init__(
        self,
        core: SwitchCore,
        port: DatagramPort,
        clock: DilatedClock,
        peers: list[tuple[str, int]],
        faults: list[LinkFaults],
    ) -> None:
        super().__init__(
            port,
            clock,
            core,
            name=f"switch {core.config.name}",
            faults=list(faults),
            peers=peers,
            recv=port.recv_from,
        )
        self.core: SwitchCore = core
        core.catchup = CATCHUP_WALL_SECONDS / clock.tdf
        self.peers = peers
        self.unknown_vni = 0
        self._by_vni = core.by_vni

    def set_faults(self, index: int, faults: LinkFaults) -> None:
        """Change a port's link faults (loss, corruption, delay) while running."""
        self.set_link_faults(index, faults)

    def deliver(self, item: tuple[bytes | memoryview, tuple[str, int]], now: float) -> None:
        """A datagram and its sender: to the port its VNI names, if the sender is that link's
        peer."""
        data, sender = item
        index = self._by_vni.get(data[4] << 16 | data[5] << 8 | data[6]) if len(data) >= 8 else None
        if index is None:
            self.unknown_vni += 1
            return
        if sender != self.peers[index]:  # only the link's far end may send into a port
            self.core.ports[index].drops["not_from_peer"] += 1
            return
        self.core.receive(index, bytes(data), now)


def switch_node(core: SwitchCore) -> Node:
    """The switch core as an engine node: each frame straight to the port its link ends at."""
    return Node(f"switch {core.config.name}", core)


class EngineSwitch:
    """The switch core as a node of the virtual-time engine: the engine delivers each frame to
    the port its link ends at, so there is no socket to demultiplex and no sender to check."""

    def __init__(
        self, core: SwitchCore, engine: Engine, clock: DilatedClock, address: tuple[str, int]
    ) -> None:
        self.core = core
        self.engine = engine
        self.clock = clock
        self.port = EnginePort(address, None)
        core.catchup = 0.0  # the engine is never late, so no frame may leave "in the past"
        self.late_wakeups = 0  # the engine is never late: it stops time instead
        self.late_seconds = 0.0
        self.late_beyond = [0] * len(BEHIND_MARKS)
        self.unknown_vni = 0
        self.node = engine.add(switch_node(core))

    @property
    def wakeups(self) -> int:
        return self.node.services

    def set_faults(self, index: int, faults: LinkFaults) -> None:
        """Change a port's link faults (loss, corruption, delay) while running."""
        wire = self.node.wires[index]
        if wire is not None:
            wire.set_faults(faults)
