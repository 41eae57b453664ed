"""A switch port's state (sans-IO, compiled with mypyc): its egress queues, per priority one
FIFO per ingress port, its pacer, the pauses its neighbour sent, and its counters.  One per
port: grows with the frames queued on it.
"""

from __future__ import annotations

from collections import Counter, deque

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


class PortState:
    """Counters and queues of one port (names after SAI port / queue statistics)."""

    def __init__(self, rate_bps: float, prio_count: int = PRIORITIES) -> None:
        self.up = True
        self.pacer = LinePacer(rate_bps)  # the egress link's transmitter
        # per priority, one FIFO per ingress port, served round-robin (see _dequeue)
        self.queues: list[dict[int, deque[QueueEntry]]] = [{} for _ in range(prio_count)]
        self.queue_bytes = [0] * prio_count
        self.queued = 0  # bit p set while priority p has frames queued (the timer's scan)
        self.peak_queue_bytes = 0  # the most any one priority's egress queue held
        self.control: deque[bytes] = deque()
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
