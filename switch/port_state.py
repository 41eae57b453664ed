"""A switch port's state (sans-IO, compiled with mypyc): its egress queues, per priority one
FIFO per ingress port, its pacer, the pauses its neighbour sent, and its counters.  One per
port: grows with the frames queued on it.
"""

from __future__ import annotations

from collections import Counter
from typing import Final

from rocev2_emu.runtime.slots import front_cut, put
from rocev2_emu.wire.linerate import LinePacer
from rocev2_emu.wire.qos import PRIORITIES


class QueueEntry:
    """A frame in an egress queue: its datagram, where it came in, its size, and whether it
    was admitted to the PFC headroom (the MMU gives that back at dequeue)."""

    __slots__ = ("datagram", "from_headroom", "in_port", "size")

    def __init__(self, datagram: bytes, in_port: int, size: int, from_headroom: bool) -> None:
        self.datagram, self.in_port, self.size, self.from_headroom = (
            datagram,
            in_port,
            size,
            from_headroom,
        )


_GONE: Final = QueueEntry(b"", -1, 0, False)  # a read slot of a Fifo: its frame let go


class Fifo:
    """Frames oldest first: ``items[head:tail]``, a list read from ``head`` that keeps its
    slots (:mod:`rocev2_emu.runtime.slots`; a deque's methods are calls through the interpreter
    in compiled code, these are native).  A read slot lets its frame go at once.  Holds as many
    slots as it once held frames."""

    def __init__(self) -> None:
        self.items: list[QueueEntry] = []
        self.head = 0
        self.tail = 0

    def empty(self) -> bool:
        return self.head == self.tail

    def push(self, e: QueueEntry) -> None:
        self.tail = put(self.items, self.tail, e)

    def pop(self) -> QueueEntry:
        """The oldest frame (the caller knows there is one)."""
        items = self.items
        head = self.head
        e = items[head]
        items[head] = _GONE
        cut = front_cut(items, head + 1, self.tail)
        self.head = head + 1 - cut
        self.tail -= cut
        return e

    def queued(self) -> list[QueueEntry]:
        return self.items[self.head : self.tail]


class PrioQueue:
    """One priority's egress queue of a port: a :class:`Fifo` per ingress port, and the line
    of ingress ports that take turns, as switch arbiters serve them: a port joins the back of
    the line when its first frame arrives and goes back there after its turn while frames of
    its are left.  The line is ``line[line_head:line_tail]``, keeping its slots as a
    :class:`Fifo` does.  Grows with the ingress ports that have frames queued."""

    def __init__(self) -> None:
        self.fifos: dict[int, Fifo] = {}
        self._line: list[int] = []
        self._line_head = 0
        self._line_tail = 0

    def empty(self) -> bool:
        return not self.fifos

    def push(self, ingress: int, e: QueueEntry, spare: list[Fifo]) -> None:
        """Queue ``e`` from ``ingress`` (a new FIFO taken from ``spare`` when there is one)."""
        fifo = self.fifos.get(ingress)
        if fifo is None:
            fifo = self.fifos[ingress] = spare.pop() if spare else Fifo()
            self._line_tail = put(self._line, self._line_tail, ingress)
        fifo.push(e)

    def pop(self, spare: list[Fifo]) -> QueueEntry:
        """The next frame of the ingress port whose turn it is (the caller knows there is
        one); an emptied FIFO goes to ``spare``."""
        line = self._line
        head = self._line_head
        ingress = line[head]
        fifo = self.fifos[ingress]
        e = fifo.pop()
        if fifo.empty():
            del self.fifos[ingress]
            spare.append(fifo)
        else:
            self._line_tail = put(line, self._line_tail, ingress)  # to the back of the line
        cut = front_cut(line, head + 1, self._line_tail)
        self._line_head = head + 1 - cut
        self._line_tail -= cut
        return e

    def drain(self) -> list[QueueEntry]:
        """Every frame queued, the line's first port's first, and the queue emptied."""
        out: list[QueueEntry] = []
        for i in range(self._line_head, self._line_tail):
            fifo = self.fifos[self._line[i]]
            out.extend(fifo.queued())
            fifo.items.clear()
            fifo.head = fifo.tail = 0
        self.fifos.clear()
        self._line.clear()
        self._line_head = self._line_tail = 0
        return out


class PortState:
    """Counters and queues of one port (names after SAI port / queue statistics)."""

    def __init__(self, rate_bps: float, prio_count: int = PRIORITIES) -> None:
        self.up = True
        self.pacer = LinePacer(rate_bps)  # the egress link's transmitter
        # per priority, one FIFO per ingress port, served round-robin
        self.queues = [PrioQueue() for _ in range(prio_count)]
        self.queue_bytes = [0] * prio_count
        self.queued = 0  # bit p set while priority p has frames queued (the timer's scan)
        self.peak_queue_bytes = 0  # the most any one priority's egress queue held
        self.control: list[bytes] = []  # PFC frames to send first (a few: a list is a FIFO)
        self.paused_until = [0.0] * prio_count  # the neighbour paused our egress
        self.paused_time = [0.0] * prio_count  # accumulated, emulated seconds
        self._paused_from = [-1.0] * prio_count
        self.rx_packets = self.rx_bytes = self.tx_packets = self.tx_bytes = 0
        self.drops: Counter[str] = Counter()
        self.ecn_marked = [0] * prio_count
        self.pfc_tx = [0] * prio_count
        self.pfc_rx = [0] * prio_count
        self.xoff_refresh_at = [0.0] * prio_count  # when to re-send XOFF upstream
        self.pending = -1  # its place in the switch's list of ports with frames to send; -1: none

    def pause(self, prio: int, until: float, now: float) -> None:
        if self._paused_from[prio] >= 0 and self.paused_until[prio] <= now:
            self._close_pause(prio)
        if until > now and self._paused_from[prio] < 0:
            self._paused_from[prio] = now
        if until <= now and self._paused_from[prio] >= 0:
            self.paused_until[prio] = now
            self._close_pause(prio)
        self.paused_until[prio] = until

    def _close_pause(self, prio: int) -> None:
        self.paused_time[prio] += self.paused_until[prio] - self._paused_from[prio]
        self._paused_from[prio] = -1.0

    def paused_seconds(self, prio: int, now: float) -> float:
        extra = 0.0
        if self._paused_from[prio] >= 0:
            extra = min(now, self.paused_until[prio]) - self._paused_from[prio]
        return self.paused_time[prio] + max(0.0, extra)
