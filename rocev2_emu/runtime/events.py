"""The one core interface and the event heap of virtual time (sans-IO, compiled with mypyc).

:class:`Core` is what every sans-IO core of the fabric is driven through, NIC and switch alike,
in the manner of aioquic's ``QuicConnection``: :meth:`~Core.receive` a datagram on a port at
``now``, :meth:`~Core.next_out` hands out the frames due by ``now`` one at a time (what a
driver does not take stays queued in the core), :meth:`~Core.get_timer` is the next deadline,
:meth:`~Core.handle_timer` runs the timers due.  The process mode's pump and this heap hold a
core object and call these four methods: no stored callables or per-frame generators between
them.  A fifth, :meth:`~Core.has_news`, lets the heap skip a driver's hook after a service
that gave it nothing to look at.

:class:`EventHeap` runs every core of a virtual fabric on one heap of events: frames in flight
on a link (:class:`Wire`: delay and seeded faults, the same decisions as the process mode's
:class:`~rocev2_emu.runtime.link.FaultyLink`) and each core's deadline (one live entry per core,
replaced lazily).  The trio task that hands control between this heap and application tasks
is :mod:`rocev2_emu.runtime.engine`, interpreted beside it.

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
from typing import Final, Protocol

from mypy_extensions import i64, mypyc_attr

from rocev2_emu.runtime.link import FaultyLink, LinkFaults

# A core serviced this many times at one instant is livelocked (a timer that never passes).
LIVELOCK_SERVICES: Final = 1_000_000
# A watcher that missed more multiples of its period than this (a quiet stretch) sees only these.
WATCH_CATCH_UP: Final = 1000
NO_TIMER: Final = -1.0  # a node with no live deadline entry on the heap


class EngineError(Exception):
    """The engine cannot go on (a core that keeps asking for the same instant)."""


@mypyc_attr(allow_interpreted_subclasses=True)
class Core:
    """The four methods a driver (the pump, the event heap) drives a sans-IO core through.
    Times are emulated seconds; datagrams are whole VXLAN datagrams."""

    def receive(self, port: int, data: bytes, now: float) -> None:
        """One datagram arrived on ``port``.  Never raises for bad input: counts it."""
        raise NotImplementedError

    def next_out(self, now: float) -> tuple[int, bytes] | None:
        """The next datagram due to leave by ``now``, as (port, datagram), or None."""
        raise NotImplementedError

    def get_timer(self) -> float | None:
        """When :meth:`next_out` or :meth:`handle_timer` next has work, or None."""
        raise NotImplementedError

    def handle_timer(self, now: float) -> None:
        """Run whatever is due by ``now``."""
        raise NotImplementedError

    def has_news(self, received: int) -> bool:
        """Whether a driver's hook after a service (:attr:`Node.after`) has anything to look
        at, ``received`` datagrams having arrived since the last: by default always."""
        return True


class LinkModel(Protocol):
    """What becomes of a datagram sent into a link at ``now``: (arrival time, datagram) for
    each copy that arrives.  :class:`~rocev2_emu.runtime.link.FaultyLink` is the product's;
    test harnesses bring their own (a tamperer, a link that is down)."""

    def fates(self, datagram: bytes, now: float) -> list[tuple[float, bytes]]: ...


class Wire:
    """One direction of a link: where a port's frames go, after which delay and faults.
    ``seq`` numbers the frames put on it (the order key of their arrivals); ``outbox``, when
    the far end is in another process, collects (arrival time, seq, datagram) for the driver
    to send instead of putting them on this heap."""

    def __init__(self, peer: Node, peer_port: int, faults: LinkFaults | None) -> None:
        self.peer = peer
        self.peer_port = peer_port
        self.seq = 0
        self.outbox: list[tuple[float, int, bytes]] | None = None
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
        faulty = self.faulty
        if isinstance(faulty, FaultyLink):
            faulty.update(faults)
        elif not faults.delay_only:
            link = FaultyLink(self._first or faults)
            link.update(faults)
            self.faulty = link


class Node:
    """A core on the heap, and ``after``: called after each service with the datagrams
    received since the last when the core :meth:`~Core.has_news`, True when it woke a trio
    task (the driver's waiters)."""

    def __init__(self, name: str, core: Core, after: Callable[[int], bool] | None = None) -> None:
        self.name = name
        self.core = core
        self.after = after
        self.wires: list[Wire | None] = []
        self.wake_at = NO_TIMER  # the time of this node's live heap entry
        self.touched = False
        self.received = 0  # datagrams since the last service
        self.services = 0
        self.index = -1  # its place in the order key (EventHeap.add numbers it if unset)
        self.deadline_seq = 0  # sequence numbers of its deadline entries


class Alarm:
    """A callback the heap runs at an emulated instant, before every other event of that
    instant: a model with no ports that hands work to the cores (a server's fabric delivering
    a transfer), on the heap instead of a trio task.  ``fire(now)`` says whether it woke a trio
    task; the heap then hands control to trio before the instant's other events, as a trio
    task's deadline would have.  One live entry on the heap per alarm, replaced lazily (the
    nodes' deadlines' way): ``at`` is its time, :data:`NO_TIMER` when it is not armed."""

    def __init__(self, number: int, fire: Callable[[float], bool]) -> None:
        self.number = number  # its place in EventHeap's alarms; its entries' port is -2 - it
        self.fire = fire
        self.at = NO_TIMER


class Event:
    """An entry of the heap: a datagram arriving on a node's port at ``at``, or (port -1) the
    node's deadline.  Ordered by (at, node index, port, seq): ``seq`` is the link's sequence
    number of the frame (a deadline's: the node's), never a heap-wide push counter."""

    def __init__(self, at: float, seq: int, node: Node, port: int, data: bytes) -> None:
        self.at = at
        self.seq = seq
        self.node = node
        self.port = port
        self.data = data


def _before(a: Event, b: Event) -> bool:
    if a.at != b.at:
        return a.at < b.at
    ai, bi = a.node.index, b.node.index
    if ai != bi:
        return ai < bi
    if a.port != b.port:
        return a.port < b.port
    return a.seq < b.seq


def _sift_up(heap: list[Event], pos: i64, event: Event) -> None:
    """Put ``event`` in the hole at ``pos``, moving it towards the root past later parents."""
    at = event.at
    while pos > 0:
        parent = (pos - 1) >> 1
        above = heap[parent]
        if above.at < at or (above.at == at and not _before(event, above)):
            break
        heap[pos] = above
        pos = parent
    heap[pos] = event


def heap_push(heap: list[Event], event: Event) -> None:
    """heapq's push, on native events (no tuple comparisons through the interpreter)."""
    heap.append(event)
    _sift_up(heap, len(heap) - 1, event)


def heap_pop(heap: list[Event]) -> Event:
    """heapq's pop (the same sift: the hole goes down to a leaf, then the last entry rises).
    Indices are native 64-bit integers and a child is read once; the times are compared
    inline, the rest of the key (:func:`_before`) only on a tie."""
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
        if right < end:
            r = heap[right]
            if r.at < c.at or (r.at == c.at and not _before(c, r)):
                c = r
                child = right
        heap[pos] = c
        pos = child
        child = 2 * pos + 1
    _sift_up(heap, pos, last)
    return first


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
        self._touched: list[Node] = []
        self.hops = 0  # frames that crossed a link
        self.woke = False  # a node's ``after`` woke a trio task: hand control to trio
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
        self._touched.append(node)
        on_kick = self.on_kick
        if on_kick is not None:
            on_kick()

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
        return bool(self._touched)

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

    def run_until(self, limit: float, progress: Callable[[], None] | None) -> float | None:
        """Run instant after instant while the next event comes before ``limit`` and no trio
        task was woken; the next event's time (None: nothing is left)."""
        nt = self.next_event_time()
        while nt is not None and nt < limit and not self.woke:
            self.now = nt
            self.run_due()
            if progress is not None:
                progress()
            nt = self.next_event_time()
        return nt

    def run_due(self) -> None:
        """Every event due by ``now``, and the services of every core they touched."""
        now = self.now
        if self._observe is not None and self._watch_k * self._period <= now:
            self._watch_due()
        heap, touched = self._heap, self._touched
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
