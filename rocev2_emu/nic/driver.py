"""The NIC's drivers: the one pump loop (:mod:`rocev2_emu.runtime.pump`) around the NIC core on
a port (:class:`NicDriver`), or a node of the virtual-time event engine
(:mod:`rocev2_emu.runtime.engine`, :class:`EngineNic`).

Either way the driver wakes the tasks that wait on the NIC: completion-queue waiters when their
queue grew, receive waiters when datagrams arrived; and a verbs call that changed the core
(a post, a modify) kicks it so it runs at once.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import trio

from rocev2_emu.nic.core import NicCore
from rocev2_emu.nic.waiters import Waiters
from rocev2_emu.runtime.clock import BEHIND_MARKS, DilatedClock
from rocev2_emu.runtime.engine import Engine, Node
from rocev2_emu.runtime.link import FaultyLink, LinkFaults
from rocev2_emu.runtime.ports import DatagramPort, PortInfo
from rocev2_emu.runtime.pump import Pump
from rocev2_emu.wire.pcap import PcapWriter


def nic_node(core: NicCore, after: Callable[[int], bool] | None = None) -> Node:
    """The NIC core as an engine node: its one port is port 0."""
    return Node(f"NIC {core.config.ip}", core, after)


class _Waiters:
    """Parking lots and handlers of what waits on one NIC core (:class:`Waiters`)."""

    core: NicCore

    def _init_waiters(self, sync: Callable[[], None] | None = None) -> None:
        self._rx_lot = trio.lowlevel.ParkingLot()
        self.waiters = Waiters(self.core, self._rx_lot, sync)
        self.cq_lots: dict[int, trio.lowlevel.ParkingLot] = self.waiters.lots
        self.cq_handlers: dict[int, Callable[[], bool]] = self.waiters.handlers

    def cq_lot(self, handle: int) -> trio.lowlevel.ParkingLot:
        return self.cq_lots.setdefault(handle, trio.lowlevel.ParkingLot())

    async def next_received(self) -> None:
        """Wait until the NIC next receives datagrams (a batch of them)."""
        self.core.receive_waiters += 1
        try:
            await self._rx_lot.park()
        finally:
            self.core.receive_waiters -= 1

    def wake_waiters(self, received: int) -> bool:
        """After the core ran: wake whoever waits on a queue that grew (True if anyone)."""
        return self.waiters.wake(received)


class NicDriver(Pump, _Waiters):
    def __init__(
        self,
        core: NicCore,
        port: DatagramPort,
        clock: DilatedClock,
        *,
        faults: LinkFaults | None = None,
        pcap: PcapWriter | None = None,
    ) -> None:
        name = f"NIC {core.config.ip}"
        super().__init__(port, clock, core, name=name, faults=[faults], pcap=pcap)
        self.core: NicCore = core
        self._init_waiters()

    @property
    def link(self) -> FaultyLink | None:
        """The link's fault state (None while the link has no faults)."""
        return self.links[0]

    def set_faults(self, faults: LinkFaults) -> None:
        """Change the link's faults (loss, corruption, delay) while running."""
        self.set_link_faults(0, faults)
        self.kick()

    def after_round(self, received: int) -> None:
        self.wake_waiters(received)

    def kicker(self) -> Callable[[], None]:
        """What a post calls to run the NIC at once (a QP's doorbell)."""
        return self.kick


class EngineNic(_Waiters):
    """The NIC core as a node of the virtual-time engine: no task of its own."""

    def __init__(self, core: NicCore, engine: Engine, clock: DilatedClock, port: PortInfo) -> None:
        self.core = core
        self.engine = engine
        self.clock = clock
        self.port = port
        self.late_wakeups = 0  # the engine is never late: it stops time instead
        self.late_seconds = 0.0
        self.late_beyond = [0] * len(BEHIND_MARKS)
        # after each service the engine wakes the waiters (compiled); its completion handlers
        # (CQ.set_handler) may read the clock (a collective driven by its completions writes
        # over a server's fabric), so trio's clock is brought to the instant first
        self._init_waiters(engine.sync_clock)
        self.node = engine.add(nic_node(core, self.waiters.wake))

    @property
    def wakeups(self) -> int:
        return self.node.services

    @property
    def link(self) -> FaultyLink | None:
        """The fault state of the link out of this NIC (None while it has only its delay)."""
        wire = self.node.wires[0] if self.node.wires else None
        return wire.faulty if wire is not None and isinstance(wire.faulty, FaultyLink) else None

    def set_faults(self, faults: LinkFaults) -> None:
        wire = self.node.wires[0] if self.node.wires else None
        if wire is not None:
            wire.set_faults(faults)
        self.kick()

    def kick(self) -> None:
        self.engine.events.kick(self.node)

    def kicker(self) -> Callable[[], None]:
        """:meth:`kick` with no interpreted frame: the heap's own method on this node."""
        return partial(self.engine.events.kick, self.node)
