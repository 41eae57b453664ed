"""The switch's trio driver: one task pumping one socket through the sans-IO pipeline.

Every port is a link to one neighbour; all of them share the switch's one UDP socket (an
unconnected one: each port sends to its own peer address) and the VXLAN VNI of an arriving
datagram names the ingress port.  The loop is the NIC's: wait once for readability or the
pipeline's next deadline, drain a bounded batch without blocking, run timers, send what is due
(through each port's propagation delay and faults), re-arm.  Late wake-ups are counted.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Final

import trio

from rocev2_emu.clock import DilatedClock, LatenessMonitor
from rocev2_emu.link import FaultyLink, LinkFaults
from rocev2_emu.ports import DatagramPort
from switch.pipeline import SwitchCore

RX_BATCH: Final = 256
CATCHUP_WALL_SECONDS: Final = 0.002


class SwitchDriver:
    def __init__(
        self,
        core: SwitchCore,
        port: DatagramPort,
        clock: DilatedClock,
        peers: list[tuple[str, int]],
        faults: list[LinkFaults],
    ) -> None:
        self.core = core
        core.catchup = CATCHUP_WALL_SECONDS / clock.tdf
        self.port = port
        self.clock = clock
        self.peers = peers
        self.links = [FaultyLink(f) if f.active else None for f in faults]
        self._faulty = [i for i, link in enumerate(self.links) if link is not None]
        self._backlog: deque[tuple[int, bytes | bytearray]] = deque()
        self.unknown_vni = 0
        self.wakeups = 0
        self.lateness = LatenessMonitor(clock, f"switch {core.config.name}")

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        core, port, clock = self.core, self.port, self.clock
        by_vni = core.by_vni
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
                index = (
                    by_vni.get(data[4] << 16 | data[5] << 8 | data[6]) if len(data) >= 8 else None
                )
                if index is None:
                    self.unknown_vni += 1
                    continue
                core.receive(index, data, now)
            core.handle_timer(now)
            if not self._transmit(now):
                await port.wait_writable()
                continue
            deadline = self._next_deadline()
            if got == RX_BATCH or (deadline is not None and deadline <= now):
                await trio.lowlevel.checkpoint()
                continue
            with trio.move_on_at(math.inf if deadline is None else clock.to_trio(deadline)):
                await port.wait_readable()

    @property
    def late_wakeups(self) -> int:
        return self.lateness.late_wakeups

    def set_faults(self, index: int, faults: LinkFaults) -> None:
        """Change a port's link faults (loss, corruption, delay) while running."""
        link = self.links[index]
        if link is None:
            self.links[index] = FaultyLink(faults)
        else:
            link.update(faults)
        self._faulty = [i for i, lk in enumerate(self.links) if lk is not None]

    def _next_deadline(self) -> float | None:
        times = [t for t in (self.core.get_timer(),) if t is not None]
        times += [t for link in self.links if link and (t := link.get_timer()) is not None]
        return min(times) if times else None

    def _transmit(self, now: float) -> bool:
        """Send what is due; False when the socket would block (the rest waits in order)."""
        backlog = self._backlog
        for index in self._faulty:
            link = self.links[index]
            assert link is not None
            backlog.extend((index, d) for d in link.due(now))
        port, peers, links = self.port, self.peers, self.links
        if backlog and not self._flush():
            return False
        for index, datagram in self.core.transmit(now):
            link = links[index]
            if link is not None:
                backlog.extend((index, d) for d in link.submit(datagram, now))
            elif backlog or not port.send_to(datagram, peers[index]):
                backlog.append((index, datagram))
        return self._flush()

    def _flush(self) -> bool:
        backlog, port, peers = self._backlog, self.port, self.peers
        while backlog:
            index, pending = backlog[0]
            if not port.send_to(pending, peers[index]):
                return False
            backlog.popleft()
        return True
