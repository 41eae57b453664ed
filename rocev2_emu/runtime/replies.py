"""The rendezvous store's replies on their way back to their hosts
(:mod:`rocev2_emu.control.kvstore`), kept alike by the virtual fabric's store
(:class:`~rocev2_emu.fabric.rendezvous.VirtualStore`) and an exact run's engine
(:class:`~rocev2_emu.runtime.exact.ExactEngine`): each reply is handed to the task that waits
for it at the emulated instant it reaches its host.
"""

from __future__ import annotations

import heapq
import math

import trio

from rocev2_emu.control.kvstore import StoreOp, StoreReply


class StoreWaiter:
    """Where the reply to one store operation lands."""

    __slots__ = ("event", "reply")

    def __init__(self) -> None:
        self.event = trio.Event()
        self.reply: StoreReply | None = None

    def deliver(self, reply: StoreReply) -> None:
        self.reply = reply
        self.event.set()


class StoreReplies:
    """The waiters of the operations in flight, by (host, sequence number), and their replies
    in a heap by arrival, ties in the order of ``tie`` (the caller's: an exact run takes the
    order the coordinator granted them in, the virtual store (host, sequence number)).  Holds
    one waiter and at most one reply per operation in flight."""

    __slots__ = ("_heap", "_waiters")

    def __init__(self) -> None:
        self._waiters: dict[tuple[int, int], StoreWaiter] = {}
        self._heap: list[tuple[float, int, int, StoreReply]] = []

    def wait(self, op: StoreOp) -> StoreWaiter:
        """Where the reply to ``op`` will land."""
        waiter = self._waiters[op.origin, op.seq] = StoreWaiter()
        return waiter

    def push(self, reply: StoreReply, tie: tuple[int, int]) -> None:
        """``reply`` is on its way; it arrives at ``reply.at``."""
        heapq.heappush(self._heap, (reply.at, *tie, reply))

    def __bool__(self) -> bool:
        return bool(self._heap)

    def next_time(self) -> float:
        """When the next reply arrives (infinity if none is on its way)."""
        return self._heap[0][0] if self._heap else math.inf

    def due(self, now: float) -> bool:
        """Hand over the replies that arrived by ``now``; True if a task was waiting for one."""
        heap = self._heap
        woke = False
        while heap and heap[0][0] <= now:
            reply = heapq.heappop(heap)[3]
            waiter = self._waiters.pop((reply.origin, reply.seq), None)
            if waiter is not None:
                waiter.deliver(reply)
                woke = True
        return woke
