"""The NIC's QP deadlines, earliest first (sans-IO, compiled with mypyc).

A QP's deadline (its requester's ACK or RNR timer, its rate control's next step) moves with
almost every packet it sends or takes.  The NIC marks the QPs an operation touched
(:meth:`Deadlines.touch`), re-reads their deadlines at its next look
(:meth:`Deadlines.refresh_touched`) and keeps one entry per change on a heap ordered by (time, QPN);
the QP itself holds its live deadline (``QueuePair.deadline``), so an entry that no longer
equals it is stale and dropped when it reaches the top.  Native entries and indices: no
tuple, no boxed float and no dictionary per look.  Grows with the deadline changes not yet
popped, at most one live entry per QP; the touched QPs are a list as long as the most QPs
once touched between two looks.
"""

from __future__ import annotations

from mypy_extensions import i64

from rocev2_emu.runtime.slots import put
from rocev2_emu.transport.qp import NO_DEADLINE, QueuePair


class Deadline:
    """One entry: ``qp``'s deadline at ``at`` (live while ``qp.deadline == at``)."""

    def __init__(self, at: float, qp: QueuePair) -> None:
        self.at = at
        self.qpn = qp.qpn
        self.qp = qp


def _before(a: Deadline, b: Deadline) -> bool:
    return a.at < b.at or (a.at == b.at and a.qpn < b.qpn)


class Deadlines:
    """The heap of :class:`Deadline` entries, heapq's algorithm on native records."""

    def __init__(self) -> None:
        self.heap: list[Deadline] = []
        # QPs whose deadline may have moved, the first ``_n_touched``, in the order first
        # touched (a list that keeps its slots: a dict or list emptied frees its memory, and
        # the next touch allocates it again)
        self._touched: list[QueuePair] = []
        self._n_touched = 0

    def touch(self, qp: QueuePair) -> None:
        """``qp``'s deadline may have moved: the next look re-reads it."""
        if qp.nic_touched:
            return
        qp.nic_touched = True
        self._n_touched = put(self._touched, self._n_touched, qp)

    def refresh_touched(self) -> None:
        """Re-read the deadlines of the QPs touched since the last look."""
        n = self._n_touched
        if not n:
            return
        touched = self._touched
        for i in range(n):
            qp = touched[i]
            qp.nic_touched = False
            if qp.alive:  # (still this NIC's: a QP is this NIC's from create_qp to destroy_qp)
                self.refresh(qp)
        self._n_touched = 0

    def refresh(self, qp: QueuePair) -> None:
        """Re-read ``qp``'s deadline; a new one goes on the heap."""
        t = qp.get_timer()
        if t is None:
            qp.deadline = NO_DEADLINE
        elif qp.deadline != t:
            qp.deadline = t
            self._push(Deadline(t, qp))

    def first(self) -> float:
        """The earliest live deadline (stale entries on top are dropped), or NO_DEADLINE."""
        heap = self.heap
        while heap:
            top = heap[0]
            if top.qp.deadline == top.at:
                return top.at
            self._pop()
        return NO_DEADLINE

    def due(self, now: float) -> QueuePair | None:
        """The QP of the earliest live deadline at or before ``now``, taken off (its deadline
        cleared), or None; in (time, QPN) order."""
        heap = self.heap
        while heap and heap[0].at <= now:
            top = self._pop()
            qp = top.qp
            if qp.deadline == top.at:
                qp.deadline = NO_DEADLINE
                return qp
        return None

    def _push(self, entry: Deadline) -> None:
        heap = self.heap
        heap.append(entry)
        self._sift_up(len(heap) - 1, entry)

    def _pop(self) -> Deadline:
        heap = self.heap
        last = heap.pop()
        end: i64 = len(heap)
        if end == 0:
            return last
        first = heap[0]
        pos: i64 = 0
        child: i64 = 1
        while child < end:
            c = heap[child]
            right = child + 1
            if right < end and _before(heap[right], c):
                c = heap[right]
                child = right
            heap[pos] = c
            pos = child
            child = 2 * pos + 1
        self._sift_up(pos, last)
        return first

    def _sift_up(self, pos: i64, entry: Deadline) -> None:
        heap = self.heap
        while pos > 0:
            parent = (pos - 1) >> 1
            above = heap[parent]
            if not _before(entry, above):
                break
            heap[pos] = above
            pos = parent
        heap[pos] = entry
