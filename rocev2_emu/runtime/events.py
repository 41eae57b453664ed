"""The event heap of virtual time (sans-IO, compiled with mypyc).

:class:`EventHeap` runs every core of a virtual fabric (:class:`~rocev2_emu.runtime.node.Core`,
on a :class:`~rocev2_emu.runtime.node.Node`) on one heap of events: frames in flight on a link
(:class:`~rocev2_emu.runtime.node.Wire`: delay and seeded faults, the same decisions as the
process mode's :class:`~rocev2_emu.runtime.link.FaultyLink`), each core's deadline (one live
entry per core, replaced lazily) and the alarms of models with no ports (a server's fabric).
The trio task that hands control between this heap and application tasks is
:mod:`rocev2_emu.runtime.engine`, interpreted beside it.

Ordering is deterministic and does not depend on the order in which events were pushed: an
event's key is (time, the receiving node's index, its port, the link's own sequence number), a
deadline's port is -1 and its sequence the node's own.  Events of one node at one instant are
all received before the node is serviced, and a node's outputs reach other nodes only after a
link's delay, so any split of a fabric over several heaps (the exact process mode,
:mod:`rocev2_emu.runtime.sync`) gives every core the same inputs in the same order as one heap.
A wire whose far end is in another process (:attr:`Wire.outbox`) queues its frames, with their
arrival times and sequence numbers, for the process's driver to send; :meth:`EventHeap.arrive`
puts a frame from another process on the heap.  The same topology, flows and seed give the same
frames, counters and results, run after run.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Final

from rocev2_emu.runtime.link import LinkFaults
from rocev2_emu.runtime.node import (
    NO_TIMER,
    Alarm,
    Core,
    Event,
    LinkModel,
    Node,
    Wire,
    heap_pop,
    heap_push,
)
from rocev2_emu.runtime.slots import put

__all__ = [
    "NO_TIMER",
    "Alarm",
    "Core",
    "EngineError",
    "Event",
    "EventHeap",
    "LinkModel",
    "Node",
    "Wire",
]

# A core serviced this many times at one instant is livelocked (a timer that never passes).
LIVELOCK_SERVICES: Final = 1_000_000
# A watcher that missed more multiples of its period than this (a quiet stretch) sees only these.
WATCH_CATCH_UP: Final = 1000


class EngineError(Exception):
    """The engine cannot go on (a core that keeps asking for the same instant)."""


class EventHeap:
    """Every core of a virtual fabric on one heap.  Add nodes, :meth:`connect` them, then step
    it with :meth:`advance_to` / :meth:`step`, or let :class:`~rocev2_emu.runtime.engine.Engine`
    run it under trio."""

    def __init__(self) -> None:
        self.now = 0.0  # emulated seconds
        self.nodes: list[Node] = []
        self._heap: list[Event] = []
        # events run and kept for the next push (no allocation a hop): at most as many as the
        # heap once held at a time, each holding no frame
        self._spare: list[Event] = []
        # the nodes due for a service: the first ``_n_touched`` of ``_touched``, and the batch
        # being serviced; the two lists swap and keep their slots (an emptied list frees its
        # buffer, which the next append allocates again): as long as the most nodes once due
        self._touched: list[Node] = []
        self._n_touched = 0
        self._batch: list[Node] = []
        self._in_batch = False
        self.hops = 0  # frames that crossed a link
        self.woke = False  # a node's ``after`` woke a trio task: hand control to trio
        self._instants = 0  # instants run_until ran since it last called its progress
        self.on_kick: Callable[[], None] | None = None  # the trio runner's wake-up
        # an observer called at every multiple of a period (watch)
        self._observe: Callable[[float], None] | None = None
        self._period = 0.0
        self._watch_k = 0
        # alarms (Alarm): their entries' node sorts before every node at an instant
        self._alarms: list[Alarm] = []
        self._alarm_node = Node("alarms", Core())
        self._alarm_node.index = -1

    # -- building --------------------------------------------------------------------------
    def add(self, node: Node) -> Node:
        if node.index < 0:
            node.index = len(self.nodes)
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
        passes, before the events of ``t`` run (None: stop).  Called between events, by the
        heap itself: no trio task and no trio deadline, so an observer that only reads (the
        map's recorder) cannot change the run's order of events.  After a long quiet stretch
        only its last multiple is observed."""
        if period <= 0:
            raise ValueError(f"watch period {period}: must be > 0")
        self._observe = observe
        self._period = period
        self._watch_k = math.ceil(self.now / period)

    def _watch_due(self) -> None:
        observe, period = self._observe, self._period
        assert observe is not None
        last = math.floor(self.now / period)
        k = max(self._watch_k, last - WATCH_CATCH_UP)
        while k <= last and k * period <= self.now:
            observe(k * period)
            k += 1
        self._watch_k = k

    def alarm(self, fire: Callable[[float], bool]) -> Alarm:
        """A new :class:`Alarm` calling ``fire``, not armed.  The heap keeps it for its life
        (one a server's fabric)."""
        alarm = Alarm(len(self._alarms), fire)
        self._alarms.append(alarm)
        return alarm

    def arm(self, alarm: Alarm, at: float) -> None:
        """``alarm`` fires at ``at`` (not before ``now``), instead of when it was armed for;
        :data:`NO_TIMER`: not at all."""
        if at == alarm.at:
            return
        if at != NO_TIMER and at < self.now:
            at = self.now
        alarm.at = at
        if at == NO_TIMER:
            return
        heap_push(self._heap, self._event(at, 0, self._alarm_node, -2 - alarm.number, b""))
        on_kick = self.on_kick
        if on_kick is not None:
            on_kick()  # (armed from a trio task: the sleeping engine wakes to see it)

    # -- events ----------------------------------------------------------------------------
    def kick(self, node: Node) -> None:
        """Something changed in ``node``'s core outside the heap (a post, a modify)."""
        if node.touched:
            return  # already due for a service: whoever runs the heap knows
        node.touched = True
        self._touch(node)
        on_kick = self.on_kick
        if on_kick is not None:
            on_kick()

    def _touch(self, node: Node) -> None:
        self._n_touched = put(self._touched, self._n_touched, node)

    def arrive(self, node: Node, port: int, at: float, seq: int, data: bytes) -> None:
        """A frame from another process, arriving on ``node``'s ``port`` at ``at`` (the
        sending wire's sequence number ``seq``).  Arriving before ``now`` breaks the
        synchronisation's promise: an error, never a silently reordered run."""
        if at < self.now:
            raise EngineError(
                f"{node.name} port {port}: a frame for t={at:.9f} s came at t={self.now:.9f} s "
                "(the lookahead was broken)"
            )
        heap_push(self._heap, self._event(at, seq, node, port, data))

    def _event(self, at: float, seq: int, node: Node, port: int, data: bytes) -> Event:
        """A spare event refilled, or a new one."""
        spare = self._spare
        if not spare:
            return Event(at, seq, node, port, data)
        event = spare.pop()
        event.at = at
        event.seq = seq
        event.node = node
        event.port = port
        event.data = data
        return event

    def _done(self, event: Event) -> None:
        event.data = b""  # the frame goes with its receiver, not with the spare
        self._spare.append(event)

    @property
    def pending(self) -> bool:
        """A kicked node waits for its service."""
        return self._n_touched > 0

    def next_event_time(self) -> float | None:
        heap = self._heap
        while heap:
            head = heap[0]
            port = head.port
            if port >= 0 or head.at == (
                head.node.wake_at if port == -1 else self._alarms[-2 - port].at
            ):
                return head.at
            self._done(heap_pop(heap))  # a deadline the node (or an alarm) has since moved
        return None

    def advance_to(self, t: float) -> None:
        """Run every event up to emulated time ``t`` (by hand: tests, no trio)."""
        self.run_due()
        while True:
            if not self.pending:  # (pending: after an alarm that woke a task; no trio here)
                nt = self.next_event_time()
                if nt is None or nt > t:
                    break
                self.now = max(self.now, nt)
            self.run_due()
        self.now = max(self.now, t)

    def step(self) -> bool:
        """Run the next instant's events; False when nothing is left to happen."""
        self.run_due()
        nt = self.next_event_time()
        if nt is None:
            return False
        self.now = max(self.now, nt)
        self.run_due()
        while self.pending or self.next_event_time() == self.now:
            self.run_due()  # after an alarm that woke a task (no trio here)
        return True

    def run_until(
        self, limit: float, progress: Callable[[], None] | None, every: int = 1
    ) -> float | None:
        """Run instant after instant while the next event comes before ``limit`` and no trio
        task was woken; ``progress`` is called after every ``every``-th instant (counted
        across calls); the next event's time (None: nothing is left)."""
        nt = self.next_event_time()
        while nt is not None and nt < limit and not self.woke:
            self.now = nt
            self.run_due()
            if progress is not None:
                self._instants += 1
                if self._instants >= every:
                    self._instants = 0
                    progress()
            nt = self.next_event_time()
        return nt

    def run_due(self) -> None:
        """Every event due by ``now``, and the services of every core they touched."""
        now = self.now
        if self._observe is not None and self._watch_k * self._period <= now:
            self._watch_due()
        heap = self._heap
        rounds = 0
        while True:
            while heap and heap[0].at <= now:
                event = heap_pop(heap)
                node = event.node
                if event.port < -1:  # an alarm: it runs at once (see Alarm)
                    alarm = self._alarms[-2 - event.port]
                    live = event.at == alarm.at
                    self._done(event)
                    if live:
                        alarm.at = NO_TIMER
                        if alarm.fire(now):
                            self.woke = True
                            return  # the woken tasks run before this instant's other events
                    continue
                if event.port < 0:
                    stale = event.at != node.wake_at
                    self._done(event)
                    if stale:
                        continue  # the node moved its deadline
                    node.wake_at = NO_TIMER
                else:
                    port, data = event.port, event.data
                    self._done(event)
                    node.core.receive(port, data, now)
                    node.received += 1
                if not node.touched:
                    node.touched = True
                    self._touch(node)
            n = self._n_touched
            if not n:
                return
            batch = self._touched
            rounds += 1
            if rounds > LIVELOCK_SERVICES:
                names = ", ".join(batch[i].name for i in range(min(n, 5)))
                raise EngineError(f"livelock at t={now:.9f} s: {names} never get past it")
            nested = self._in_batch  # (a service that runs the heap: a list of its own)
            if nested:
                self._touched = []
            else:
                self._touched = self._batch
                self._batch = batch
            self._n_touched = 0
            self._in_batch = True
            for i in range(n):
                self._service(batch[i], now)
            self._in_batch = nested

    def _service(self, node: Node, now: float) -> None:
        node.touched = False
        node.services += 1
        core = node.core
        core.handle_timer(now)
        wires = node.wires
        heap = self._heap
        while True:
            out = core.next_out(now)
            if out is None:
                break
            port, data = out
            wire = wires[port]
            if wire is None:
                continue
            self.hops += 1
            faulty = wire.faulty
            outbox = wire.outbox
            if faulty is None:
                wire.seq += 1
                if outbox is not None:
                    outbox.append((now + wire.delay, wire.seq, data))
                else:
                    heap_push(
                        heap,
                        self._event(now + wire.delay, wire.seq, wire.peer, wire.peer_port, data),
                    )
            else:
                for at, copy in faulty.fates(data, now):
                    wire.seq += 1
                    if outbox is not None:
                        outbox.append((at, wire.seq, copy))
                    else:
                        heap_push(heap, self._event(at, wire.seq, wire.peer, wire.peer_port, copy))
        after = node.after
        if after is not None and core.has_news(node.received) and after(node.received):
            self.woke = True
        node.received = 0
        t = core.get_timer()
        if t is None:
            node.wake_at = NO_TIMER
        elif t != node.wake_at:
            if t < now:
                t = now
            node.wake_at = t
            node.deadline_seq += 1
            heap_push(heap, self._event(t, node.deadline_seq, node, -1, b""))
