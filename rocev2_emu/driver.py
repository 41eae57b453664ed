"""The NIC's trio driver: one task that pumps datagrams between a port and the sans-IO core.

Its loop is the whole shell (DESIGN.md, "Facts of this machine"): wait once for readability or
the core's next deadline, drain the socket without blocking (a bounded batch), let the core
handle timers, send everything the core has due (awaiting writability only on EAGAIN), wake the
tasks waiting on completion queues, and re-arm one deadline.  No per-packet task, channel or
sleep.  Optional per-link faults and a pcap of both directions (emulated timestamps) hook in
here.  Late wake-ups are counted: past that point the emulation is no longer faithful.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Final

import trio

from rocev2_emu.clock import DilatedClock, LatenessMonitor
from rocev2_emu.ethernet import VXLAN_LEN
from rocev2_emu.link import FaultyLink, LinkFaults
from rocev2_emu.nic import NicCore
from rocev2_emu.pcap import PcapWriter
from rocev2_emu.ports import DatagramPort

RX_BATCH: Final = 256


class NicDriver:
    def __init__(
        self,
        core: NicCore,
        port: DatagramPort,
        clock: DilatedClock,
        *,
        faults: LinkFaults | None = None,
        pcap: PcapWriter | None = None,
    ) -> None:
        self.core = core
        self.port = port
        self.clock = clock
        self.link = FaultyLink(faults) if faults is not None and faults.active else None
        self.pcap = pcap
        self.rx_lot = trio.lowlevel.ParkingLot()
        self.cq_lots: dict[int, trio.lowlevel.ParkingLot] = {}
        self._cq_seen: dict[int, int] = {}
        self._backlog: deque[bytes | bytearray] = deque()
        self._scope: trio.CancelScope | None = None
        self._kicked = False
        self.wakeups = 0
        self.lateness = LatenessMonitor(clock, f"NIC {core.config.ip}")

    def set_faults(self, faults: LinkFaults) -> None:
        """Change the link's faults (loss, corruption, delay) while running."""
        if self.link is None:
            self.link = FaultyLink(faults)
        else:
            self.link.update(faults)
        self.kick()

    @property
    def late_wakeups(self) -> int:
        return self.lateness.late_wakeups

    def kick(self) -> None:
        """Something changed outside the driver (a post, a modify): run the loop now."""
        if self._scope is not None:
            self._scope.cancel()
        else:
            self._kicked = True

    def cq_lot(self, handle: int) -> trio.lowlevel.ParkingLot:
        return self.cq_lots.setdefault(handle, trio.lowlevel.ParkingLot())

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        core, port, clock = self.core, self.port, self.clock
        deadline: float | None = None
        while True:
            now = clock.now()
            self.wakeups += 1
            self.lateness.woke(now, deadline)
            got = 0
            while got < RX_BATCH:
                data = port.recv()
                if data is None:
                    break
                got += 1
                if self.pcap is not None:
                    self.pcap.write(now, memoryview(data)[VXLAN_LEN:])
                core.receive_datagram(data, now)
            core.handle_timer(now)
            if not self._transmit(now):
                await port.wait_writable()
                continue
            self._wake_waiters(got)
            deadline = self._next_deadline()
            if got == RX_BATCH or self._kicked or (deadline is not None and deadline <= now):
                self._kicked = False
                await trio.lowlevel.checkpoint()
                continue
            at = math.inf if deadline is None else clock.to_trio(deadline)
            with trio.move_on_at(at) as scope:
                self._scope = scope
                await port.wait_readable()
            self._scope = None

    def _next_deadline(self) -> float | None:
        t = self.core.get_timer()
        if self.link is not None:
            lt = self.link.get_timer()
            if lt is not None and (t is None or lt < t):
                t = lt
        return t

    def _transmit(self, now: float) -> bool:
        """Send what is due; False when the socket would block (the rest stays queued)."""
        port = self.port
        backlog = self._backlog
        while backlog:
            if not port.send(backlog[0]):
                return False
            backlog.popleft()
        link = self.link
        if link is not None:
            backlog.extend(link.due(now))
        core = self.core
        pcap = self.pcap
        while True:
            while backlog:
                if not port.send(backlog[0]):
                    return False
                backlog.popleft()
            datagram = core.next_datagram(now)
            if datagram is None:
                return True
            if pcap is not None:
                pcap.write(now, memoryview(datagram)[VXLAN_LEN:])
            if link is None:
                if not port.send(datagram):
                    backlog.append(datagram)
                    return False
            else:
                backlog.extend(link.submit(datagram, now))

    def _wake_waiters(self, got: int) -> None:
        for cq in self.core.cqs:
            if self._cq_seen.get(cq.handle) != cq.pushed:
                self._cq_seen[cq.handle] = cq.pushed
                lot = self.cq_lots.get(cq.handle)
                if lot is not None:
                    lot.unpark_all()
        if got:
            self.rx_lot.unpark_all()
