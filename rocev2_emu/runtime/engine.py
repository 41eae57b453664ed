"""The event engine of virtual time under trio: the compiled event heap
(:mod:`rocev2_emu.runtime.events`) driving every NIC and switch core directly, and the one trio
task that hands control between it and the application tasks, under trio's MockClock.

No trio task, channel or cancel scope exists per frame: the engine is one trio task that runs
events until an application task has become runnable (a completion woke a waiter, a post kicked
a NIC) or until a trio deadline comes before the next event, and otherwise moves the mock clock
itself (``MockClock.jump``).  So applications (verbs users, agents, collectives) stay plain trio
code and see exact emulated time, while frames cost no scheduler round-trip.  This module stays
interpreted (it awaits); the heap beside it is compiled.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from time import perf_counter
from typing import ClassVar

import trio
import trio.testing

from rocev2_emu.runtime.events import NO_TIMER, Core, EngineError, EventHeap, Node
from rocev2_emu.runtime.link import LinkFaults

__all__ = ["Core", "Engine", "EngineError", "ModelAlarm", "Node"]


class Engine:
    """Every core of a virtual fabric on one heap.  Add nodes, :meth:`connect` them, then run
    :meth:`run` as a trio task (under MockClock) or step it by hand with :meth:`advance_to`."""

    # wall seconds every engine of this process has spent running events in :meth:`run` (the
    # cores, and the completion handlers their hooks run; not trio's tasks or set-up): what
    # ``bench virtual`` divides the frame-hops by for the engine's own rate
    running_seconds: ClassVar[float] = 0.0

    def __init__(self) -> None:
        self.events = EventHeap()
        self.events.on_kick = self._wake
        self.origin = 0.0  # the trio-clock time of emulated 0 (set by run)
        self.progress: Callable[[Engine], None] | None = None
        self._scope: trio.CancelScope | None = None
        self._clock: trio.testing.MockClock | None = None  # while :meth:`run` runs
        self._synced = -1.0  # the engine's time trio's clock was last brought to
        self._quiet = trio.lowlevel.ParkingLot()  # tasks waiting for the fabric to go quiet

    # -- the heap's surface ----------------------------------------------------------------
    @property
    def now(self) -> float:
        """Emulated seconds."""
        return self.events.now

    @property
    def hops(self) -> int:
        """Frames that crossed a link."""
        return self.events.hops

    @property
    def nodes(self) -> list[Node]:
        return self.events.nodes

    def add(self, node: Node) -> Node:
        return self.events.add(node)

    def connect(
        self, a: Node, a_port: int, b: Node, b_port: int, faults: tuple[LinkFaults | None, ...]
    ) -> None:
        """A full-duplex link between ``a``'s port and ``b``'s; ``faults`` for a->b, b->a."""
        self.events.connect(a, a_port, b, b_port, faults)

    def watch(self, period: float, observe: Callable[[float], None] | None) -> None:
        """See :meth:`~rocev2_emu.runtime.events.EventHeap.watch`."""
        self.events.watch(period, observe)

    def kick(self, node: Node) -> None:
        """Something changed in ``node``'s core outside the engine (a post, a modify)."""
        self.events.kick(node)

    def advance_to(self, t: float) -> None:
        """Run every event up to emulated time ``t`` (by hand: tests, no trio)."""
        self.events.advance_to(t)

    def step(self) -> bool:
        """Run the next instant's events; False when nothing is left to happen."""
        return self.events.step()

    @property
    def quiet(self) -> bool:
        """Nothing is left to happen in the fabric: no frame in flight, no core deadline."""
        return self.events.next_event_time() is None and not self.events.pending

    async def wait_quiet(self) -> None:
        """Until the fabric is :attr:`quiet`: a job's counters are read then, when no frame
        of it (a last CNP, an XON) can still change them, the same instant in every mode."""
        while not self.quiet:
            await self._quiet.park()

    def _wake(self) -> None:
        if self._scope is not None:
            self._scope.cancel()

    # -- in trio ---------------------------------------------------------------------------
    def to_trio(self, emulated: float) -> float:
        return self.origin + emulated

    def _sync_clock(self, clock: trio.testing.MockClock) -> None:
        """Move the mock clock to the engine's time before trio runs again."""
        ahead = self.to_trio(self.events.now) - clock.current_time()  # (trio.current_time's)
        if ahead > 0:
            clock.jump(ahead)

    @contextmanager
    def clock_of_run(self, clock: trio.testing.MockClock) -> Iterator[None]:
        """The block is this engine's trio run on ``clock`` (:meth:`sync_clock` moves it)."""
        self._clock, self._synced = clock, -1.0
        try:
            yield
        finally:
            self._clock = None  # sync_clock outside the run does nothing

    def sync_clock(self) -> None:
        """Move trio's clock to the engine's instant now, from inside the engine's run: a
        node's ``after`` hook about to run interpreted code that reads the emulated time (a
        completion handler driving a collective) sees this instant, not the last one trio
        ran at.  Nothing to do when the engine is stepped by hand."""
        now = self.events.now
        clock = self._clock
        if clock is not None and now != self._synced:
            self._synced = now  # trio's clock never moves back: at this instant it is there
            ahead = self.origin + now - clock.current_time()  # (_sync_clock's, inline: per hook)
            if ahead > 0:
                clock.jump(ahead)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """The engine as a trio task under MockClock: runs until cancelled.

        Each round first lets every application task run until it blocks
        (``wait_all_tasks_blocked``: trio's own test of "nothing runnable, nothing due now").
        Then trio's next deadline cannot move while no application task runs, so one look at
        ``current_statistics()`` bounds how far the engine may go on its own, instant after
        instant with no trio call at all; a waiter it woke or a deadline a node's hook set
        inside it (``woke``: a collective's NVLink transfer), or the deadline reached, hands
        control back at that instant."""
        clock = trio.lowlevel.current_clock()
        if not isinstance(clock, trio.testing.MockClock):
            raise EngineError("the event engine runs only under trio.testing.MockClock")
        events = self.events
        self.origin = trio.current_time() - events.now
        task_status.started()
        statistics = trio.lowlevel.current_statistics
        settle = trio.testing.wait_all_tasks_blocked
        progress = self.progress
        report = None if progress is None else (lambda: progress(self))
        with self.clock_of_run(clock):
            while True:
                # every application task runs until it blocks, at this instant, before time moves
                await settle()
                started = perf_counter()
                events.now = max(events.now, clock.current_time() - self.origin)
                events.woke = False
                events.run_due()
                if events.woke:
                    Engine.running_seconds += perf_counter() - started
                    continue
                limit = events.now + statistics().seconds_to_next_deadline  # inf when trio has none
                nt = events.run_until(limit, report)
                self._sync_clock(clock)
                Engine.running_seconds += perf_counter() - started
                if events.woke:
                    continue
                if nt is None and self._quiet.unpark_all():
                    continue  # they run at this instant; the engine comes back when they block
                at = math.inf if nt is None else self.to_trio(nt)
                with trio.move_on_at(at) as scope:
                    self._scope = scope
                    await trio.sleep_forever()
                self._scope = None
                if (
                    scope.cancelled_caught
                    and nt is not None
                    and not events.pending
                    and trio.current_time() >= at
                ):
                    events.now = max(events.now, nt)  # woke for that event (not an alarm's arming)


class ModelAlarm:
    """A model beside the fabric (a server's NVLink crossbar, the rendezvous store) run by an
    :class:`~rocev2_emu.runtime.node.Alarm` on ``engine``'s heap instead of a trio task.

    ``due(now)`` runs at the model's next time (``next_time()``; None: nothing is due), with
    trio's clock brought to that instant first and ``now`` never a rounding before the
    host clock's ``clock_now()``; it returns True when it woke a task (trio then runs before
    the instant's frames).  The alarm is armed again after each run; :meth:`rearm` after the
    model changed outside one.  Holds one alarm on the heap for the engine's life."""

    def __init__(
        self,
        engine: Engine,
        clock_now: Callable[[], float],
        next_time: Callable[[], float | None],
        due: Callable[[float], bool],
    ) -> None:
        self.engine = engine
        self._clock_now = clock_now
        self._next_time = next_time
        self._due = due
        self._alarm = engine.events.alarm(self._fire)

    def rearm(self) -> None:
        """The model changed: fire at its next time."""
        nt = self._next_time()
        self.engine.events.arm(self._alarm, NO_TIMER if nt is None else nt)

    def stop(self) -> None:
        """Run nothing more (the end of a job's own model)."""
        self.engine.events.arm(self._alarm, NO_TIMER)
        self._alarm.fire = _nothing

    def _fire(self, now: float) -> bool:
        self.engine.sync_clock()
        try:
            return self._due(max(self._clock_now(), now))  # (the instant, not a rounding before)
        finally:
            self.rearm()


def _nothing(now: float) -> bool:
    return False
