"""What the event heap of virtual time holds (sans-IO, compiled with mypyc): the one core
interface, nodes and their wires, alarms, and the heap's entries in their order.

:class:`Core` is what every sans-IO core of the fabric is driven through, NIC and switch alike,
in the manner of aioquic's ``QuicConnection``: :meth:`~Core.receive` a datagram on a port at
``now``, :meth:`~Core.next_out` hands out the frames due by ``now`` one at a time (what a
driver does not take stays queued in the core), :meth:`~Core.get_timer` is the next deadline,
:meth:`~Core.handle_timer` runs the timers due.  The process mode's pump and the heap
(:mod:`rocev2_emu.runtime.events`) hold a core object and call these four methods: no stored
callables or per-frame generators between them.  A fifth, :meth:`~Core.has_news`, lets the
heap skip a driver's hook after a service that gave it nothing to look at.

An :class:`Event` is a frame arriving on a node's port, a node's deadline or an alarm; the heap
of them is a binary heap of native entries (:func:`heap_push`, :func:`heap_pop`), ordered by
(time, the receiving node's index, its port, the link's own sequence number), never by the
order they were pushed in.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final, Protocol

from mypy_extensions import i64, mypyc_attr

from rocev2_emu.runtime.link import FaultyLink, LinkFaults

NO_TIMER: Final = -1.0  # a node (or an alarm) with no live entry on the heap


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
