"""The one pump loop: a trio task moving datagrams between a port and a sans-IO core.

The NIC driver and the switch driver are this loop with their own hooks (DESIGN.md, "Facts of
this machine"): wait once for readability or the core's next deadline, drain a bounded batch
without blocking, let the core handle its timers, send everything it has due (awaiting
writability only on EAGAIN), and re-arm one deadline.  No per-packet task, channel or sleep.
Frames leave through each link's faults and propagation delay (:mod:`rocev2_emu.runtime.link`);
an optional pcap records both directions with emulated timestamps.  Wake-ups later than their
deadline are counted: past that point the emulation is no longer faithful.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from functools import partial
from typing import Any, Final

import trio

from rocev2_emu.runtime.clock import DilatedClock, LatenessMonitor
from rocev2_emu.runtime.events import Core
from rocev2_emu.runtime.link import FaultyLink, LinkFaults
from rocev2_emu.runtime.ports import DatagramPort
from rocev2_emu.wire.ethernet import VXLAN_LEN, wire_len
from rocev2_emu.wire.pcap import PcapWriter

RX_BATCH: Final = 256  # datagrams drained per wake-up before the loop yields to other tasks
TX_BATCH: Final = 64  # datagrams to one link gathered for one batched send (GSO)
# A late pump may send this far (real seconds) "in the past" to keep a link's average rate; the
# cores get it in emulated seconds (divided by the TDF) through their line-rate pacers.
CATCHUP_WALL_SECONDS: Final = 0.002

Datagram = bytes | bytearray


class Pump:
    """Pumps ``port`` for one sans-IO ``core`` (:class:`~rocev2_emu.runtime.events.Core`).

    Each item ``recv()`` returns (default ``port.recv``, the datagram; a switch passes
    ``port.recv_from``, the datagram and its sender) goes to :meth:`deliver`, which hands it to
    the core (port 0 here; the switch's driver demultiplexes).  The core's ``next_out`` is asked
    for frames one at a time while the socket takes them, so what a blocked socket cannot take
    stays in the core's own queues.  ``peers`` names each link's far end (None: one link through
    the port's connected peer).
    """

    def __init__(
        self,
        port: DatagramPort,
        clock: DilatedClock,
        core: Core,
        *,
        name: str,
        faults: list[LinkFaults | None],
        peers: list[tuple[str, int]] | None = None,
        pcap: PcapWriter | None = None,
        recv: Callable[[], Any] | None = None,
    ) -> None:
        self.port = port
        self.clock = clock
        self.pcap = pcap
        self.core = core
        # a timing-only NIC's frames are their headers: a capture records their whole length
        self._elide = bool(getattr(core, "elide", False))
        self._recv = recv or port.recv
        self._send_batch: list[Callable[[list[Datagram]], int]] = (
            [port.send_batch]
            if peers is None
            else [partial(port.send_batch, peer=p) for p in peers]
        )
        self.links: list[FaultyLink | None] = [
            FaultyLink(f) if f is not None and f.active else None for f in faults
        ]
        self._faulty = [i for i, link in enumerate(self.links) if link is not None]
        self._backlog: deque[tuple[int, Datagram]] = deque()
        self._scope: trio.CancelScope | None = None
        self._kicked = False
        self.wakeups = 0
        self.lateness = LatenessMonitor(clock, name)

    @property
    def late_wakeups(self) -> int:
        return self.lateness.late_wakeups

    @property
    def late_seconds(self) -> float:
        """Emulated seconds behind schedule, summed over the late wake-ups."""
        return self.lateness.late_seconds

    @property
    def late_beyond(self) -> list[int]:
        """Late wake-ups more than each of ``clock.BEHIND_MARKS`` behind (emulated)."""
        return self.lateness.late_beyond

    def set_link_faults(self, index: int, faults: LinkFaults) -> None:
        """Change a link's faults (loss, corruption, delay) while running."""
        link = self.links[index]
        if link is None:
            self.links[index] = FaultyLink(faults)
        else:
            link.update(faults)
        self._faulty = [i for i, lk in enumerate(self.links) if lk is not None]

    def kick(self) -> None:
        """Something changed outside the loop (a post, a modify): run it now."""
        if self._scope is not None:
            self._scope.cancel()
        else:
            self._kicked = True

    def deliver(self, item: Any, now: float) -> None:
        """One item ``recv()`` returned: a datagram for the core's one port."""
        self.core.receive(0, bytes(item), now)

    def after_round(self, received: int) -> None:
        """Called after each round that sent everything due; drivers wake their waiters."""

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        port, clock, core, deliver, recv, pcap = (
            self.port,
            self.clock,
            self.core,
            self.deliver,
            self._recv,
            self.pcap,
        )
        elide = self._elide
        deadline: float | None = None
        while True:
            now = clock.now()
            self.wakeups += 1
            self.lateness.woke(now, deadline)
            got = 0
            while got < RX_BATCH:
                item = recv()
                if item is None:
                    break
                got += 1
                if pcap is not None:  # a NIC's: its items are datagrams
                    size = wire_len(bytes(item)) if elide else -1
                    pcap.write(now, memoryview(item)[VXLAN_LEN:], size)
                deliver(item, now)
            core.handle_timer(now)
            if not self._transmit(now):
                await port.wait_writable()
                continue
            self.after_round(got)
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
        for index in self._faulty:
            link = self.links[index]
            assert link is not None
            lt = link.get_timer()
            if lt is not None and (t is None or lt < t):
                t = lt
        return t

    def _transmit(self, now: float) -> bool:
        """Send what is due; False when the socket would block (the rest waits, in order)."""
        if not self._flush():
            return False
        backlog, links = self._backlog, self.links
        for index in self._faulty:
            link = links[index]
            assert link is not None
            backlog.extend((index, d) for d in link.due(now))
        if not self._flush():
            return False
        pcap = self.pcap
        elide = self._elide
        batch: list[Datagram] = []  # due datagrams to one link, in order, sent together
        batch_index = -1
        next_out = self.core.next_out
        while (out := next_out(now)) is not None:
            index, datagram = out
            if pcap is not None:
                pcap.write(
                    now, memoryview(datagram)[VXLAN_LEN:], wire_len(datagram) if elide else -1
                )
            link = links[index]
            if batch and (index != batch_index or link is not None or len(batch) >= TX_BATCH):
                if not self._send_run(batch_index, batch):
                    return False
                batch = []
            if link is not None:
                now_due = link.submit(datagram, now)  # usually none: held for the delay
                if now_due:
                    backlog.extend((index, d) for d in now_due)
                    if not self._flush():
                        return False
            else:
                batch.append(datagram)
                batch_index = index
        return not batch or self._send_run(batch_index, batch)

    def _send_run(self, index: int, batch: list[Datagram]) -> bool:
        """Send a run of datagrams to one link in one batched call; what the socket would not
        take waits in the backlog, in order."""
        sent = self._send_batch[index](batch)
        if sent < len(batch):
            self._backlog.extend((index, d) for d in batch[sent:])
            return False
        return True

    def _flush(self) -> bool:
        """Send the backlog in order: each run of datagrams to one link (what a link's delay
        released together, up to ``TX_BATCH``) in one batched call; False when the socket
        would block (the rest stays, in order)."""
        backlog, send_batch = self._backlog, self._send_batch
        while backlog:
            index = backlog[0][0]
            run: list[Datagram] = []
            for to, datagram in backlog:
                if to != index or len(run) == TX_BATCH:
                    break
                run.append(datagram)
            sent = send_batch[index](run)
            for _ in range(sent):
                backlog.popleft()
            if sent < len(run):
                return False
        return True
