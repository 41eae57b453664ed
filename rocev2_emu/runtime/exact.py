"""The event engine of one process of an exact run: the cores it hosts on its own heap, the
links to other processes as real UDP datagrams carrying their emulated arrival times, and the
windows of :mod:`rocev2_emu.runtime.sync`.

:class:`ExactEngine` is the virtual-time :class:`~rocev2_emu.runtime.engine.Engine` (trio under
MockClock, applications on the engine's clock exactly as in one process) whose run loop stops
at the end of each granted window: it reports to the coordinator, waits for the next window,
takes in the frames other processes sent it (all of them: the coordinator says how many), and
runs on.  Its rooms: the frames to and from the other processes
(:class:`~rocev2_emu.runtime.exchange.FrameExchange`), the rendezvous store's operations and
replies, the changes to the fabric at emulated instants
(:class:`~rocev2_emu.runtime.exact_changes.RunChanges`), the clock holds, and the barrier
between windows (:meth:`ExactEngine._barrier`), whose link beats while the process computes a
window (:meth:`~rocev2_emu.runtime.sync_link.SyncLink.computing`).
"""

from __future__ import annotations

import contextlib
import math
import os
import time
from typing import Any, Final, NoReturn

import trio
import trio.testing

from rocev2_emu.control.channel import MessageChannel
from rocev2_emu.control.kvstore import StoreOp
from rocev2_emu.runtime.engine import Engine, EngineError
from rocev2_emu.runtime.exact_changes import ChangeWaiter, RunChanges
from rocev2_emu.runtime.exchange import FrameExchange, RemoteLink
from rocev2_emu.runtime.ports import UdpPort
from rocev2_emu.runtime.replies import StoreReplies, StoreWaiter
from rocev2_emu.runtime.sync import (
    BLOCK_SECONDS,
    TRIO_EVERY,
    set_holder,
)
from rocev2_emu.runtime.sync_link import SyncLink
from rocev2_emu.runtime.sync_messages import (
    DONE,
    Grant,
    LinkChange,
    Report,
    RunOver,
    Stop,
    SyncError,
    from_coordinator,
    process_label,
)

STASH_SECONDS: Final = 0.001  # wall seconds between two looks at the socket in a window
STASH_STRIDE: Final = 8  # instants between two looks at the clock for it

_ENGINE: trio.lowlevel.RunVar[ExactEngine | None] = trio.lowlevel.RunVar("exact_engine", None)


def current_engine() -> ExactEngine | None:
    """The exact engine of this trio run (None: not an exact process)."""
    try:
        return _ENGINE.get()
    except RuntimeError:
        return None


class ExactEngine(Engine):
    """The engine of one process of an exact run (see the module)."""

    def __init__(self, name: str, udp: UdpPort, chan: MessageChannel) -> None:
        super().__init__()
        self.name = name
        self.exchange = FrameExchange(name, udp, self.events)
        self.chan = SyncLink(chan) if chan is not None else None
        self.rounds = 0
        self._inflight = math.inf  # the earliest arrival of what was sent since the last report
        self._holds = 0
        self._poke: trio.CancelScope | None = None
        self._store_out: list[StoreOp] = []  # store operations since the last report
        # the store's replies on their way to this host's tasks, ties in the grants' order
        self._replies = StoreReplies()
        self._replies_seen = 0
        self.changes = RunChanges()  # asked for here, handed out, applied at their instants
        self._paused = False  # the application decides its next step (wall time): nothing runs
        self._done = False  # the application has finished; the process serves the fabric only
        self.fast = False  # the last grant came with every task still blocked (_barrier)
        # another thread's request for trio (a control request) interrupts a grant's wait in
        # the kernel: interrupt() makes this pipe readable (open for the process's life, as
        # its link socket)
        self._interrupt_r = self._interrupt_w = -1
        if self.chan is not None:
            self._interrupt_r, self._interrupt_w = os.pipe()
            os.set_blocking(self._interrupt_r, False)
            os.set_blocking(self._interrupt_w, False)
            self.chan.watch(self._interrupt_r)
            self.chan.drain_with(udp.sock.fileno(), self.exchange.stash)
        self._trio_seen = 0.0  # when trio last ran its tasks (wall, time.monotonic)
        self._stash_at = 0.0  # when the socket is next emptied while a window runs (wall)

    def _between_instants(self) -> None:
        """The heap's call after every :data:`STASH_STRIDE` instants of a window: every
        :data:`STASH_SECONDS` of wall time the datagrams other processes sent meanwhile are
        taken off the socket (:meth:`FrameExchange.stash`), so that a long window does not
        leave them to a receive buffer that fills."""
        now = time.monotonic()
        if now >= self._stash_at:
            self.exchange.stash()
            self._stash_at = now + STASH_SECONDS

    def link(self, link: RemoteLink) -> RemoteLink:
        return self.exchange.link(link)

    # -- the rendezvous store (rocev2_emu.control.kvstore; the coordinator keeps it) ----------
    def store_call(self, op: StoreOp) -> StoreWaiter:
        """Send ``op`` to the store (with the next report); its reply lands in the waiter at
        the emulated time it arrives."""
        waiter = self._replies.wait(op)
        self._store_out.append(op)
        if op.at < self._inflight:
            self._inflight = op.at
        return waiter

    # -- changes to the fabric at emulated instants (rocev2_emu.runtime.sync.LinkChange) ------
    def change_links(
        self,
        at: float | None,
        pairs: list[tuple[str, str]],
        *,
        up: bool,
        faults: tuple[tuple[str, float], ...] | None = None,
    ) -> ChangeWaiter:
        """Ask for the links between the named nodes to go down (or up; or to take ``faults``,
        sorted settings of a :class:`LinkFaults`) at emulated ``at``, everywhere in the run at
        once (at least one lookahead from now: the coordinator refuses a change the run has
        already passed, and the run stops; None: as soon as the run can take it, for a change
        from outside the run - the waiter then learns the instant it was given)."""
        if at is not None and not at >= self.events.now:
            raise EngineError(f"a link change at t={at!r} is before now ({self.events.now!r})")
        waiter = self.changes.ask(LinkChange(at, tuple(pairs), up, faults))
        self._wake_barrier()
        return waiter

    @property
    def holds(self) -> int:
        """Out-of-band waits holding this process's clock now."""
        return self._holds

    # -- the clock hold (rocev2_emu.runtime.sync.holding_clock) --------------------------------
    def hold(self) -> None:
        self._holds += 1

    def release(self) -> None:
        self._holds -= 1
        if not self._holds:
            self._wake_barrier()

    # -- an application that decides in wall time (the torch backend) ------------------------
    def pause(self) -> None:
        """The application decides what it does next in wall time (a training script between
        two collectives): no event runs here and the clock stays where it is until
        :meth:`resume`, so what it does next happens at this instant whatever the wall clock
        says.  The coordinator hears that the process is busy (a long pause is not a stall)."""
        if not self._paused:
            self._paused = True
            self.hold()

    def resume(self) -> None:
        if self._paused:
            self._paused = False
            self.release()

    def finished(self) -> None:
        """The application is done: the process only serves the fabric (its NIC answers) until
        the run ends; the coordinator hears it (:meth:`Coordinator.apps_done`)."""
        self.resume()
        self._done = True
        self._wake_barrier()

    def interrupt(self) -> None:
        """From another thread, before it asks trio for something (a control request): a
        grant awaited in the kernel (:meth:`_barrier`) is awaited in trio from now on, so
        that the request is served at once."""
        with contextlib.suppress(OSError):  # full: it has been written already
            os.write(self._interrupt_w, b"\0")

    def _drain_interrupts(self) -> None:
        with contextlib.suppress(OSError):  # empty
            while os.read(self._interrupt_r, 4096):
                pass

    def _wake_barrier(self) -> None:
        if self._poke is not None:
            self._poke.cancel()

    def _wake(self) -> None:  # a kick: also re-report if waiting for a window
        super()._wake()
        self._wake_barrier()

    # -- the windows -----------------------------------------------------------------------
    def _flush(self) -> None:
        """Send what the cores put on links to other processes (:meth:`FrameExchange.flush`)."""
        first = self.exchange.flush()
        if first < self._inflight:
            self._inflight = first

    def report(self, to_deadline: float | None = None) -> Report:
        """What this process tells the coordinator (``to_deadline``: trio's seconds to its
        next deadline, when the caller has them)."""
        events, exchange = self.events, self.exchange
        heap_next = events.next_event_time()
        if to_deadline is None:
            to_deadline = trio.lowlevel.current_statistics().seconds_to_next_deadline
        deadline = trio.current_time() + to_deadline
        nxt = min(math.inf if heap_next is None else heap_next, deadline - self.origin)
        nxt = min(nxt, self._inflight, self._replies.next_time(), self.changes.next_time())
        if self._holds or events.pending:  # held, or work due at this instant (a wake's)
            nxt = min(nxt, events.now)
        quiet = (
            heap_next is None
            and not events.pending
            and self._inflight == math.inf
            and not self._replies
            and not self.changes.pending
            and not self._paused
        )
        ops, self._store_out = self._store_out, []
        changes = self.changes.take_asked()
        return Report(
            nxt,
            quiet,
            exchange.sent,
            exchange.received,
            self.rounds,
            exchange.strays,
            ops,
            changes,
            held=bool(self._holds),
            busy=self._paused,
            done=self._done,
        )

    async def _barrier(self) -> float:
        """Report, then wait for the next window (re-reporting when a kick or the end of a
        clock hold changed what this process would say); the window's end.  The application
        tasks have all run and blocked when it is called, and the engine has not yielded to
        trio since they did (only its own wakes may have made one runnable).

        The grant is first awaited in the kernel, trio standing still, when nothing else can
        happen here meanwhile: no task runnable, nothing waited for since all blocked, and
        trio seen within :data:`TRIO_EVERY` (so control requests and thread calls are still
        served).  A grant taken that way leaves every task blocked as it was, and the next
        window runs with no scheduling pass of trio (:attr:`fast`); one that does not come
        within :data:`BLOCK_SECONDS` (a held run) is awaited in trio."""
        statistics = trio.lowlevel.current_statistics
        settle = trio.testing.wait_all_tasks_blocked
        stats = statistics()
        if stats.tasks_runnable:
            await settle()  # a task woken while the window ran (a control request's) first
            self._trio_seen = time.monotonic()
            stats = statistics()  # (none runnable now: all blocked)
        waited = await self.exchange.send_backlog()
        chan = self.chan
        assert chan is not None
        chan.computing(False)
        report = self.report(stats.seconds_to_next_deadline)
        waited = await chan.send(report.wire()) or waited
        if not waited and not self._holds and time.monotonic() - self._trio_seen < TRIO_EVERY:
            # (held - an out-of-band wait, a paused application - no window comes until trio
            # has run the task that releases it)
            came, msg = chan.recv_blocking(BLOCK_SECONDS)
            if came:
                said = from_coordinator(msg)
                if isinstance(said, Stop):  # the run's end, or an error
                    return self._stopped(said)
                self.take_grant(said)
                waited = await self.exchange.take_in(said.expect)
                # (a change's waiter the grant set is a task made runnable: trio runs it)
                self.fast = not waited and not said.changes
                chan.computing(True)
                return said.until
            self._drain_interrupts()
        while True:
            poked, msg = await self._await_coordinator(chan)
            self._trio_seen = time.monotonic()
            if poked:
                # a fresh report, nothing run: the one sent may already be the basis of a
                # window granted to the others, so this process keeps its promise (no event
                # before the time it reported) until it hears from the coordinator; work the
                # wake made due now makes the report say now, and the coordinator grants the
                # window it has already granted again for it (a process that is not held never
                # waits with work before the end of its window)
                await settle()
                await chan.send(self.report().wire())
                continue
            said = from_coordinator(msg)
            if isinstance(said, Stop):
                return self._stopped(said)
            self.take_grant(said)
            await self.exchange.take_in(said.expect)
            chan.computing(True)
            return said.until

    async def _await_coordinator(self, chan: SyncLink) -> tuple[bool, Any]:
        """(False, the coordinator's next message) awaited in trio, or (True, None) if a wake
        (:meth:`_wake_barrier`) came first.  Meanwhile the frames other processes send land
        in the stash as they come (:meth:`FrameExchange.stash`): a long wait does not leave a
        burst to a receive buffer that fills.  The wake cancels the wait for the message only,
        never a message taken (the stash's task ends after, in a scope of its own)."""
        async with trio.open_nursery() as nursery:
            if self.exchange.links:
                nursery.start_soon(self._drain_socket)
            with trio.CancelScope() as scope:
                self._poke = scope
                msg = await chan.recv()
            self._poke = None
            nursery.cancel_scope.cancel()
        return (True, None) if scope.cancelled_caught else (False, msg)

    async def _drain_socket(self) -> None:
        udp, stash = self.exchange.udp, self.exchange.stash
        while True:
            await udp.wait_readable()
            stash()

    def _stopped(self, stop: Stop) -> NoReturn:
        """What the coordinator said instead of a window: the run's end, or why it stopped."""
        if stop.reason == DONE:
            raise RunOver(self.name)
        raise SyncError(f"{process_label(self.name)}: the run was stopped: {stop.reason}")

    def take_grant(self, grant: Grant) -> None:
        """Take in a window's grant (the store's replies, the changes to the fabric).  Its
        frames are taken in next (:meth:`take_in`)."""
        self.rounds += 1
        self._inflight = math.inf
        for reply in grant.store:
            self._replies_seen += 1
            self._replies.push(reply, (self._replies_seen, 0))
        self.changes.hand_out(grant.changes, self.name)

    def install(self) -> None:
        """This trio run's engine from now on: the emulated store's and the clock holds' (a
        control request served before :meth:`run` starts - the control ports listen first -
        finds it; what it asks waits for the first window)."""
        set_holder(self)
        _ENGINE.set(self)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """The engine as a trio task under MockClock (no autojump: this loop moves the clock),
        window by window, until cancelled."""
        clock = trio.lowlevel.current_clock()
        if not isinstance(clock, trio.testing.MockClock) or clock.autojump_threshold != math.inf:
            raise EngineError("an exact run's engine needs trio.testing.MockClock() (no autojump)")
        events = self.events
        self.origin = trio.current_time() - events.now
        self.install()
        task_status.started()
        statistics = trio.lowlevel.current_statistics
        settle = trio.testing.wait_all_tasks_blocked
        between = self._between_instants if self.exchange.links else None
        await settle()
        until = await self._barrier()
        with self.clock_of_run(clock):
            while True:
                # every task runs until it blocks before time moves: one woken in the window, and
                # after a barrier one a control request started (it may be in the batch trio runs
                # with the engine, not yet at its first wait when the grant came) - unless the
                # grant came with trio standing still (every task still blocked: _barrier)
                if self.fast:
                    self.fast = False
                else:
                    await settle()
                    self._trio_seen = time.monotonic()
                events.now = max(events.now, trio.current_time() - self.origin)
                if self._paused:  # the application's next step comes at this instant
                    until = await self._barrier()
                    continue
                events.woke = False
                if events.now < until:
                    if self.changes.pending:  # rare: no call per pass in a run without them
                        self.changes.apply(events.now)
                    if self._replies.due(events.now):
                        continue  # the waiting tasks run first, as a trio deadline's would
                    events.run_due()
                    self._flush()
                    if events.woke:
                        continue
                deadline = trio.current_time() - self.origin + statistics().seconds_to_next_deadline
                trio_next = min(deadline, self._replies.next_time(), self.changes.next_time())
                limit = min(until, trio_next)
                nt = events.run_until(limit, between, STASH_STRIDE)
                self._flush()
                self._sync_clock(clock)
                if events.woke:
                    continue
                nxt = min(math.inf if nt is None else nt, trio_next)
                if nxt < until and not self._holds:
                    # an application deadline before the window's end: trio runs it at its time
                    ahead = self.to_trio(nxt) - trio.current_time()
                    if ahead > 0:
                        clock.jump(ahead)
                    events.now = max(events.now, nxt)
                    await self.exchange.send_backlog()
                    continue
                until = await self._barrier()
