"""The rendezvous store as a node of the emulation (sans-IO): a key-value service at a fixed
emulated latency from every host, so that a job's rendezvous takes emulated time and runs in
one order whether the fabric is one process or many.

A host's operation leaves at ``t`` and reaches the store at ``t + latency``; the store applies
the operations that reached it in the order (arrival time, host index, the host's own sequence
number) - never the order in which they were handed over - and each reply reaches its host
``latency`` after the operation was applied.  A ``get`` of a missing key waits at the store
until a ``set`` (or an ``add``) of it is applied; its reply leaves then.  ``take`` is a ``get``
that removes the key it answers with (a key that one peer reads once: a connection's QP
description), so the store holds what is on its way, not every connection a job ever made; a
``set`` answers the gets waiting for its key and the first waiting take, and leaves the takes
after that waiting for the next ``set``.  A client gives up at
its own deadline (an emulated trio deadline); the store does not know.  ``arrive`` (a
barrier's) adds one to a counter and is answered, with every earlier arrival at it, when the
counter reaches the operation's count: every member leaves the barrier at the same instant.

The virtual fabric drives a :class:`StoreCore` from a trio task
(:class:`collectives.comm.store.VirtualStore`); an exact run keeps it in the coordinator
(:mod:`rocev2_emu.runtime.sync`), which applies each window's operations before granting it:
an operation sent in a window arrives after its end, because the latency is at least the
lookahead.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field
from typing import Any, Final

STORE_LATENCY: Final = 2e-6  # emulated seconds, one way, between any host and the store
MAX_KEY: Final = 1024  # characters in a key
# keys in one store at once: an all-to-all's set-up holds three a pair of ranks until the
# peers take them (3.1 M at 1 024 ranks, 12.6 M at 2 048); the store's clients are the run's
# own hosts (the virtual process's, or an exact run's processes, which proved the secret)
MAX_KEYS: Final = 1 << 24
INT64: Final = (-(1 << 63), (1 << 63) - 1)  # what a counter holds (and msgpack carries)
OPS: Final = ("set", "add", "get", "take", "arrive")


@dataclass(slots=True, order=True)
class StoreOp:
    """An operation on its way to the store (ordered by arrival, host, sequence)."""

    at: float  # when it reaches the store
    origin: int  # the host's index in the topology
    seq: int  # the host's own count of its operations
    op: str = field(compare=False)
    key: str = field(compare=False)
    value: Any = field(compare=False, default=None)

    def wire(self) -> list[Any]:
        return [self.at, self.origin, self.seq, self.op, self.key, self.value]

    @classmethod
    def from_wire(cls, item: Any) -> StoreOp:
        """An operation as a process sent it, checked (ValueError names what is wrong)."""
        if not isinstance(item, list | tuple) or len(item) != 6:
            raise ValueError(
                f"a store operation is [at, origin, seq, op, key, value]: {item!r:.80}"
            )
        at, origin, seq, op, key, value = item
        if not isinstance(at, int | float) or not math.isfinite(at) or at < 0:
            raise ValueError(f"store operation time {at!r:.40}")
        if not isinstance(origin, int) or not isinstance(seq, int) or op not in OPS:
            raise ValueError(f"store operation {op!r:.20} from {origin!r:.20} #{seq!r:.20}")
        if not isinstance(key, str) or not 0 < len(key) <= MAX_KEY:
            raise ValueError(f"key {key!r:.80}: a string of 1 to {MAX_KEY} characters")
        if op in ("add", "arrive") and (not isinstance(value, int) or isinstance(value, bool)):
            raise ValueError(f"amount {value!r:.80}: an integer")
        return cls(float(at), origin, seq, op, key, value)


@dataclass(slots=True)
class StoreReply:
    """The answer to operation ``seq`` of host ``origin``, reaching it at ``at``: ``value``, or
    ``error`` (a full store, a counter that is no int64)."""

    at: float
    origin: int
    seq: int
    value: Any = None
    error: str | None = None

    def wire(self) -> list[Any]:
        return [self.at, self.origin, self.seq, self.value, self.error]


class StoreCore:
    """The store's state and its order of operations (see the module)."""

    def __init__(self, latency: float = STORE_LATENCY) -> None:
        if not latency > 0:
            raise ValueError(f"store latency {latency!r}: must be > 0")
        self.latency = latency
        self.data: dict[str, Any] = {}
        self._pending: list[StoreOp] = []
        self._waiting: dict[str, list[StoreOp]] = {}  # gets of keys not set yet
        self._arrived: dict[str, list[StoreOp]] = {}  # arrivals at counters short of their count
        self.applied = 0

    def submit(self, op: StoreOp) -> None:
        heapq.heappush(self._pending, op)

    def next_time(self) -> float | None:
        """When the next operation reaches the store (None: none is on its way)."""
        return self._pending[0].at if self._pending else None

    def run_until(self, limit: float) -> list[StoreReply]:
        """Apply every operation that reaches the store before ``limit``, in order; the
        replies."""
        replies: list[StoreReply] = []
        pending = self._pending
        while pending and pending[0].at < limit:
            self._apply(heapq.heappop(pending), replies)
        return replies

    def _apply(self, op: StoreOp, replies: list[StoreReply]) -> None:
        self.applied += 1
        back = op.at + self.latency
        data = self.data
        if op.op in ("get", "take"):
            if op.key in data:
                got = data.pop(op.key) if op.op == "take" else data[op.key]
                replies.append(StoreReply(back, op.origin, op.seq, got))
            else:
                self._waiting.setdefault(op.key, []).append(op)
            return
        if op.key not in data and len(data) >= MAX_KEYS:
            replies.append(
                StoreReply(back, op.origin, op.seq, None, f"the store holds {MAX_KEYS} keys")
            )
            return
        if op.op == "arrive":
            count = data.get(op.key, 0)
            if not isinstance(count, int):
                replies.append(
                    StoreReply(back, op.origin, op.seq, None, f"{op.key!r} is no counter")
                )
                return
            data[op.key] = count = count + 1
            waiting = self._arrived.setdefault(op.key, [])
            waiting.append(op)
            if count >= op.value:
                del self._arrived[op.key]
                replies.extend(StoreReply(back, w.origin, w.seq, count) for w in waiting)
            return
        if op.op == "add":
            current = data.get(op.key, 0)
            if not isinstance(current, int) or not INT64[0] <= current + op.value <= INT64[1]:
                why = f"counter {op.key!r}: {current!r:.40} + {op.value} is no int64"
                replies.append(StoreReply(back, op.origin, op.seq, None, why))
                return
            value: Any = current + op.value
            data[op.key] = value
            replies.append(StoreReply(back, op.origin, op.seq, value))
        else:
            data[op.key] = value = op.value
            replies.append(StoreReply(back, op.origin, op.seq, True))
        waiting = self._waiting.pop(op.key, [])
        for k, waiter in enumerate(waiting):
            replies.append(StoreReply(back, waiter.origin, waiter.seq, value))
            if waiter.op == "take":  # it took the key: the others wait for the next set
                del data[op.key]
                if k + 1 < len(waiting):
                    self._waiting[op.key] = waiting[k + 1 :]
                break
