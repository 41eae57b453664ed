"""The discrete-event engine of virtual time: one heap of (time, sequence) events driving the
sans-IO cores of every NIC and switch directly, under trio's MockClock.

Frames leave a core when its line-rate pacer lets them (the core's own ``transmit``), cross a
link after its delay and faults (:class:`~rocev2_emu.runtime.link.FaultyLink`, the same seeded
decisions as the process mode's), and arrive at the far core as the same bytes a socket would
carry.  A core's next deadline (``get_timer``) is one heap entry, replaced lazily when it
changes.  No trio task, channel or cancel scope exists per frame: the engine is one trio task
that runs events until an application task has become runnable (a completion woke a waiter,
a post kicked a NIC) or until a trio deadline comes before the next event, and otherwise moves
the mock clock itself (``MockClock.jump``).  So applications (verbs users, agents, collectives)
stay plain trio code and see exact emulated time, while frames cost no scheduler round-trip.

Ordering is deterministic: events at one time run in the order they were scheduled, and the
cores they touched are serviced in the order they were first touched.  The same topology, flows
and seed give the same frames, counters and results, run after run.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Iterable
from typing import Any, Final, Protocol

import trio
import trio.testing

from rocev2_emu.runtime.link import FaultyLink, LinkFaults

Datagram = bytes | bytearray
# A core serviced this many times at one instant is livelocked (a timer that never passes).
LIVELOCK_SERVICES: Final = 1_000_000
# A watcher that missed more multiples of its period than this (a quiet stretch) sees only these.
WATCH_CATCH_UP: Final = 1000


class EngineError(RuntimeError):
    """The engine cannot go on (a core that keeps asking for the same instant)."""


class LinkModel(Protocol):
    """What becomes of a datagram sent into a link at ``now``: (arrival time, datagram) for
    each copy that arrives.  :class:`~rocev2_emu.runtime.link.FaultyLink` is the product's;
    test harnesses bring their own (a tamperer, a link that is down)."""

    def fates(self, datagram: bytes, now: float) -> list[tuple[float, bytes]]: ...


class Wire:
    """One direction of a link: where a port's frames go, after which delay and faults."""

    __slots__ = ("_first", "delay", "faulty", "peer", "peer_port")

    def __init__(self, peer: Node, peer_port: int, faults: LinkFaults | None) -> None:
        self.peer = peer
        self.peer_port = peer_port
        self.delay = 0.0
        # only while something besides the delay is set (or a harness's own model)
        self.faulty: LinkModel | None = None
        self._first = faults
        self.set_faults(faults)

    def set_faults(self, faults: LinkFaults | None) -> None:
        """New faults at run time.  As in the process mode, the link's random state is seeded
        once, from the faults it started with, and carries on across changes."""
        if faults is None:
            return
        self.delay = faults.delay
        if isinstance(self.faulty, FaultyLink):
            self.faulty.update(faults)
        elif not faults.delay_only:
            self.faulty = FaultyLink(self._first or faults)
            self.faulty.update(faults)


class Node:
    """A core in the engine, seen through the same four hooks a pump uses, and ``after``:
    called after each service with the datagrams received since the last, True when it woke
    a trio task."""

    __slots__ = (
        "after",
        "get_timer",
        "handle_timer",
        "name",
        "receive",
        "received",
        "services",
        "touched",
        "transmit",
        "wake_at",
        "wires",
    )

    def __init__(
        self,
        name: str,
        *,
        receive: Callable[[int, Datagram, float], None],
        transmit: Callable[[float], Iterable[tuple[int, Datagram]]],
        get_timer: Callable[[], float | None],
        handle_timer: Callable[[float], None],
        after: Callable[[int], bool] | None = None,
    ) -> None:
        self.name = name
        self.receive = receive
        self.transmit = transmit
        self.get_timer = get_timer
        self.handle_timer = handle_timer
        self.after = after
        self.wires: list[Wire | None] = []
        self.wake_at: float | None = None  # the time of this node's live heap entry
        self.touched = False
        self.received = 0  # datagrams since the last service
        self.services = 0


class Engine:
    """Every core of a virtual fabric on one heap.  Add nodes, :meth:`connect` them, then run
    :meth:`run` as a trio task (under MockClock) or step it by hand with :meth:`advance_to`."""

    def __init__(self) -> None:
        self.now = 0.0  # emulated seconds
        self.origin = 0.0  # the trio-clock time of emulated 0 (set by run)
        self.nodes: list[Node] = []
        self._heap: list[tuple[float, int, Node, int, Any]] = []
        self._seq = 0
        self._touched: list[Node] = []
        self._scope: trio.CancelScope | None = None
        self.hops = 0  # frames that crossed a link
        self.progress: Callable[[Engine], None] | None = None
        self.woke = False  # a node's ``after`` woke a trio task: hand control to trio
        # an observer called at every multiple of a period (watch): (function, period, next k)
        self._watch: tuple[Callable[[float], None], float] | None = None
        self._watch_k = 0

    # -- building --------------------------------------------------------------------------
    def add(self, node: Node) -> Node:
        self.nodes.append(node)
        return node

    def connect(
        self, a: Node, a_port: int, b: Node, b_port: int, faults: tuple[LinkFaults | None, ...]
    ) -> None:
        """A full-duplex link between ``a``'s port and ``b``'s; ``faults`` for a->b, b->a."""
        for node, port, peer, peer_port, f in (
            (a, a_port, b, b_port, faults[0]),
            (b, b_port, a, a_port, faults[1]),
        ):
            while len(node.wires) <= port:
                node.wires.append(None)
            node.wires[port] = Wire(peer, peer_port, f)

    def watch(self, period: float, observe: Callable[[float], None] | None) -> None:
        """Call ``observe(t)`` at every multiple ``t`` of ``period`` that emulated time
        passes, before the events of ``t`` run (None: stop).  The engine calls it between
        events, itself: no trio task and no trio deadline, so an observer that only reads (the
        map's recorder) cannot change the run's order of events.  After a long quiet stretch
        only its last multiple is observed."""
        if period <= 0:
            raise ValueError(f"watch period {period}: must be > 0")
        self._watch = None if observe is None else (observe, period)
        self._watch_k = math.ceil(self.now / period)

    def _observe(self) -> None:
        assert self._watch is not None
        observe, period = self._watch
        last = math.floor(self.now / period)
        k = max(self._watch_k, last - WATCH_CATCH_UP)
        while k <= last and k * period <= self.now:
            observe(k * period)
            k += 1
        self._watch_k = k

    # -- events ----------------------------------------------------------------------------
    def kick(self, node: Node) -> None:
        """Something changed in ``node``'s core outside the engine (a post, a modify)."""
        if not node.touched:
            node.touched = True
            self._touched.append(node)
        if self._scope is not None:
            self._scope.cancel()

    def next_event_time(self) -> float | None:
        heap = self._heap
        while heap:
            t, _, node, port, _ = heap[0]
            if port >= 0 or t == node.wake_at:
                return t
            heapq.heappop(heap)  # a deadline the node has since moved
        return None

    def advance_to(self, t: float) -> None:
        """Run every event up to emulated time ``t`` (by hand: tests, no trio)."""
        self._run_due()
        while (nt := self.next_event_time()) is not None and nt <= t:
            self.now = max(self.now, nt)
            self._run_due()
        self.now = max(self.now, t)

    def step(self) -> bool:
        """Run the next instant's events; False when nothing is left to happen."""
        self._run_due()
        nt = self.next_event_time()
        if nt is None:
            return False
        self.now = max(self.now, nt)
        self._run_due()
        return True

    def _run_due(self) -> None:
        """Every event due by ``self.now``, and the services of every core they touched."""
        now = self.now
        if self._watch is not None and self._watch_k * self._watch[1] <= now:
            self._observe()
        heap, touched = self._heap, self._touched
        pop = heapq.heappop
        rounds = 0
        while True:
            while heap and heap[0][0] <= now:
                t, _, node, port, data = pop(heap)
                if port < 0:
                    if t != node.wake_at:
                        continue  # stale: the node moved its deadline
                    node.wake_at = None
                else:
                    node.receive(port, data, now)
                    node.received += 1
                if not node.touched:
                    node.touched = True
                    touched.append(node)
            if not touched:
                return
            rounds += 1
            if rounds > LIVELOCK_SERVICES:
                names = ", ".join(n.name for n in touched[:5])
                raise EngineError(f"livelock at t={now:.9f} s: {names} never get past it")
            batch = touched[:]
            touched.clear()
            for node in batch:
                self._service(node, now)

    def _service(self, node: Node, now: float) -> None:
        node.touched = False
        node.services += 1
        node.handle_timer(now)
        wires = node.wires
        heap, push = self._heap, heapq.heappush
        for port, datagram in node.transmit(now):
            wire = wires[port]
            if wire is None:
                continue
            self.hops += 1
            data = datagram if type(datagram) is bytes else bytes(datagram)
            if wire.faulty is None:
                self._seq += 1
                push(heap, (now + wire.delay, self._seq, wire.peer, wire.peer_port, data))
            else:
                for at, copy in wire.faulty.fates(data, now):
                    self._seq += 1
                    push(heap, (at, self._seq, wire.peer, wire.peer_port, copy))
        if node.after is not None and node.after(node.received):
            self.woke = True
        node.received = 0
        t = node.get_timer()
        if t is None:
            node.wake_at = None
        elif t != node.wake_at:
            if t < now:
                t = now
            node.wake_at = t
            self._seq += 1
            push(heap, (t, self._seq, node, -1, None))

    # -- in trio ---------------------------------------------------------------------------
    def to_trio(self, emulated: float) -> float:
        return self.origin + emulated

    def _sync_clock(self, clock: trio.testing.MockClock) -> None:
        """Move the mock clock to the engine's time before trio runs again."""
        ahead = self.to_trio(self.now) - trio.current_time()
        if ahead > 0:
            clock.jump(ahead)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """The engine as a trio task under MockClock: runs until cancelled.

        Each round first lets every application task run until it blocks
        (``wait_all_tasks_blocked``: trio's own test of "nothing runnable, nothing due now").
        Then trio's next deadline cannot move while no application task runs, so one look at
        ``current_statistics()`` bounds how far the engine may go on its own, instant after
        instant with no trio call at all; a waiter it woke (``woke``) or the deadline reached
        hands control back at that instant."""
        clock = trio.lowlevel.current_clock()
        if not isinstance(clock, trio.testing.MockClock):
            raise EngineError("the event engine runs only under trio.testing.MockClock")
        self.origin = trio.current_time() - self.now
        task_status.started()
        statistics = trio.lowlevel.current_statistics
        settle = trio.testing.wait_all_tasks_blocked
        progress = self.progress
        while True:
            # every application task runs until it blocks, at this instant, before time moves
            await settle()
            self.now = max(self.now, trio.current_time() - self.origin)
            self.woke = False
            self._run_due()
            if self.woke:
                continue
            limit = self.now + statistics().seconds_to_next_deadline  # inf when trio has none
            nt = self.next_event_time()
            while nt is not None and nt < limit and not self.woke:
                self.now = nt
                self._run_due()
                if progress is not None:
                    progress(self)
                nt = self.next_event_time()
            self._sync_clock(clock)
            if self.woke:
                continue
            at = math.inf if nt is None else self.to_trio(nt)
            with trio.move_on_at(at) as scope:
                self._scope = scope
                await trio.sleep_forever()
            self._scope = None
            if scope.cancelled_caught and nt is not None and not self._touched:
                self.now = max(self.now, nt)  # woke for that event: it is due
