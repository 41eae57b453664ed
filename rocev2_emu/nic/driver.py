"""The NIC's trio driver: the one pump loop (:mod:`rocev2_emu.runtime.pump`) around the NIC core.

Besides pumping, it wakes the tasks that wait on the NIC: completion-queue waiters when their
queue grew, receive waiters when datagrams arrived; and a verbs call that changed the core
(a post, a modify) kicks the loop so it runs at once.
"""

from __future__ import annotations

from collections.abc import Iterator

import trio

from rocev2_emu.nic.core import NicCore
from rocev2_emu.runtime.clock import DilatedClock
from rocev2_emu.runtime.link import FaultyLink, LinkFaults
from rocev2_emu.runtime.ports import DatagramPort
from rocev2_emu.runtime.pump import Datagram, Pump
from rocev2_emu.wire.pcap import PcapWriter


class NicDriver(Pump):
    def __init__(
        self,
        core: NicCore,
        port: DatagramPort,
        clock: DilatedClock,
        *,
        faults: LinkFaults | None = None,
        pcap: PcapWriter | None = None,
    ) -> None:
        super().__init__(
            port,
            clock,
            name=f"NIC {core.config.ip}",
            receive=core.receive_datagram,
            transmit=self._due,
            get_timer=core.get_timer,
            handle_timer=core.handle_timer,
            faults=[faults],
            pcap=pcap,
        )
        self.core = core
        self.rx_lot = trio.lowlevel.ParkingLot()
        self.cq_lots: dict[int, trio.lowlevel.ParkingLot] = {}
        self._cq_seen: dict[int, int] = {}

    @property
    def link(self) -> FaultyLink | None:
        """The link's fault state (None while the link has no faults)."""
        return self.links[0]

    def set_faults(self, faults: LinkFaults) -> None:
        """Change the link's faults (loss, corruption, delay) while running."""
        self.set_link_faults(0, faults)
        self.kick()

    def cq_lot(self, handle: int) -> trio.lowlevel.ParkingLot:
        return self.cq_lots.setdefault(handle, trio.lowlevel.ParkingLot())

    def _due(self, now: float) -> Iterator[tuple[int, Datagram]]:
        next_datagram = self.core.next_datagram
        while (datagram := next_datagram(now)) is not None:
            yield 0, datagram

    def after_round(self, received: int) -> None:
        for cq in self.core.cqs:
            if self._cq_seen.get(cq.handle) != cq.pushed:
                self._cq_seen[cq.handle] = cq.pushed
                lot = self.cq_lots.get(cq.handle)
                if lot is not None:
                    lot.unpark_all()
        if received:
            self.rx_lot.unpark_all()
