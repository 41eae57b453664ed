"""The rendezvous store of emulated time: a host's client of the store that is a node of the
emulation (:mod:`rocev2_emu.control.kvstore`), the store run inside the virtual fabric's
process, and an exact run's, kept by the coordinator.

Each operation takes :data:`~rocev2_emu.control.kvstore.STORE_LATENCY` to reach the store and as
long back, and the store applies them in one order, so a job's rendezvous (the collectives'
bootstrap, their barriers) takes the same emulated time and order in one process and over many.
The collectives' :mod:`collectives.comm.store` offers these beside its TCP store of the wall clock.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import trio

from rocev2_emu.control.kvstore import STORE_LATENCY, StoreCore, StoreOp
from rocev2_emu.runtime.clock import DilatedClock
from rocev2_emu.runtime.engine import Engine, ModelAlarm
from rocev2_emu.runtime.exact import current_engine
from rocev2_emu.runtime.replies import StoreReplies, StoreWaiter
from rocev2_emu.verbs import RemoteVerbsError
from rocev2_emu.verbs.oob import PeerExchange

# The longest an operation waits for its answer when it names no deadline (set, add): the
# store answers within microseconds of emulated time, so this is an answer lost, and the rank
# stops naming the operation instead of idling through emulated time for ever.
ANSWER_DEADLINE = 60.0


class StoreTimeout(Exception):
    """A key did not appear within the deadline (or an answer never came)."""


class EmulatedStore:
    """A host's client of the emulated store (see the module); ``origin`` is the host's index
    in the topology, ``call`` hands an operation to the store and returns where its reply
    lands."""

    def __init__(
        self, origin: int, clock: DilatedClock, call: Callable[[StoreOp], StoreWaiter]
    ) -> None:
        self.origin = origin
        self.clock = clock
        self._call = call
        self._seq = 0

    async def _op(self, op: str, key: str, value: Any, timeout: float = ANSWER_DEADLINE) -> Any:
        self._seq += 1
        now = self.clock.now()
        waiter = self._call(StoreOp(now + STORE_LATENCY, self.origin, self._seq, op, key, value))
        deadline = self.clock.to_trio(now + timeout) if timeout < math.inf else math.inf
        with trio.move_on_at(deadline):
            await waiter.event.wait()
            reply = waiter.reply
            assert reply is not None
            if reply.at > self.clock.now():  # applied at the store: the answer travels back
                await trio.sleep_until(self.clock.to_trio(reply.at))
            if reply.error is not None:
                raise RemoteVerbsError(f"rendezvous store: {reply.error}")
            return reply.value
        if op in ("set", "add"):
            raise StoreTimeout(
                f"rendezvous store: no answer to {op} {key!r} within {timeout:g} emulated s"
            )
        raise StoreTimeout(f"rendezvous key {key!r} did not appear within {timeout:g} s")

    async def set(self, key: str, value: Any) -> None:
        await self._op("set", key, value)

    async def add(self, key: str, amount: int) -> int:
        return int(await self._op("add", key, amount))

    async def get(self, key: str, timeout: float) -> Any:
        return await self._op("get", key, None, timeout)

    async def take(self, key: str, timeout: float) -> Any:
        return await self._op("take", key, None, timeout)

    async def arrive(self, key: str, count: int, timeout: float) -> None:
        await self._op("arrive", key, count, timeout)


class StoreChannel(PeerExchange):
    """Two hosts' out-of-band channel through the emulated store (a perftest pair's on the
    event engine): message n from ``me`` to ``peer`` is key ``{name}/{me}->{peer}/{n}``, so it
    takes the store's emulated time there and back, the same in one process as over several.
    ``recv`` waits at most ``timeout`` emulated seconds."""

    def __init__(
        self, store: EmulatedStore, name: str, me: str, peer: str, timeout: float = 60.0
    ) -> None:
        self.store = store
        self.timeout = timeout
        self._out = f"{name}/{me}->{peer}/"
        self._in = f"{name}/{peer}->{me}/"
        self._sent = self._received = 0

    async def send(self, obj: Any) -> None:
        self._sent += 1
        await self.store.set(f"{self._out}{self._sent}", obj)

    async def recv(self) -> Any:
        self._received += 1
        return await self.store.get(f"{self._in}{self._received}", self.timeout)

    async def aclose(self) -> None:
        """Nothing to close (the store's keys stay for the run)."""


class VirtualStore:
    """The emulated store inside the virtual fabric's process: a :class:`StoreCore` applied at
    each operation's arrival time, each reply handed to its waiter when it reaches the host (as
    an exact run's engine does), so a waiting task wakes once an operation.  On ``engine`` the
    store's next change is an alarm on its heap (no task: see
    :class:`~rocev2_emu.runtime.events.Alarm`); without one a trio task (:meth:`run`) applies
    it.  Holds the operations and replies on their way: one each per waiting task."""

    def __init__(self, clock: DilatedClock, engine: Engine | None = None) -> None:
        self.core = StoreCore()
        self.clock = clock
        self._replies = StoreReplies()  # ties by (host, sequence number)
        self._kick = trio.lowlevel.ParkingLot()
        self.engine = engine
        self._alarm = (
            None if engine is None else ModelAlarm(engine, clock.now, self._next_time, self._due)
        )

    @property
    def on_engine(self) -> bool:
        """Its operations are an alarm on an engine's heap (:meth:`run` is not needed)."""
        return self._alarm is not None

    def client(self, origin: int, clock: DilatedClock) -> EmulatedStore:
        return EmulatedStore(origin, clock, self._submit)

    def _submit(self, op: StoreOp) -> StoreWaiter:
        waiter = self._replies.wait(op)
        self.core.submit(op)
        if self._alarm is not None:
            self._alarm.rearm()
        else:
            self._kick.unpark_all()
        return waiter

    def _next_time(self) -> float | None:
        nt = self.core.next_time()
        if self._replies and (nt is None or self._replies.next_time() < nt):
            nt = self._replies.next_time()
        return nt

    def _due(self, now: float) -> bool:
        """Apply the operations that reached the store by ``now`` and hand over the replies
        that reached their hosts; True if any was handed over (its task wakes)."""
        for reply in self.core.run_until(math.nextafter(now, math.inf)):
            self._replies.push(reply, (reply.origin, reply.seq))
        return self._replies.due(now)

    async def run(self) -> None:
        """Without an engine: apply each operation when it reaches the store, and hand each
        reply over when it reaches its host, until cancelled."""
        clock = self.clock
        while True:
            nt = self._next_time()
            if nt is None:
                await self._kick.park()
                continue
            with trio.move_on_at(clock.to_trio(nt)):
                await self._kick.park()  # a new operation may arrive before nt
                continue
            self._due(max(clock.now(), nt))  # (woke for nt: it is due)


def exact_store(origin: int, clock: DilatedClock) -> EmulatedStore:
    """A host's client of the store an exact run's coordinator keeps (in a host process of an
    exact run only)."""
    engine = current_engine()
    if engine is None:
        raise RuntimeError("the emulated store needs an exact run's engine in this process")
    return EmulatedStore(origin, clock, engine.store_call)
