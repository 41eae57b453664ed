"""Conservative synchronisation of an emulation split over processes: the wire format of a
frame between processes, the coordinator's windows, and the clock hold of out-of-band waits.

The model is ns-3's distributed simulator (``DistributedSimulatorImpl``: every rank reports
the time of its next event, an all-reduce takes the global minimum, and each rank runs the
events of the granted window) with SST's per-window message accounting, on this project's own
engine (:mod:`rocev2_emu.runtime.events`).  A *round*:

1. every process runs the events of its window - those strictly before ``until`` - sending the
   frames its cores put on links to other processes as UDP datagrams, then *reports*: the time
   of its next event (its heap's, its application tasks' next trio deadline, or "now" while an
   out-of-band wait holds its clock), the earliest arrival time of the frames it sent in the
   window, and how many frames it has sent to each other process since the start;
2. once every process has reported, the coordinator grants the next window to all:
   ``until = min(everything reported) + lookahead``, where the lookahead is the smallest delay
   of a link between processes, and tells each process how many frames it must have received
   from each other process before it runs it (what that one has sent it so far): counted per
   sender, because the datagrams of one sender reach a receiver in the order they were sent,
   but a frame sent in the last window may still be on its way (a bridge, a busy kernel)
   when another process's frame of the next one arrives.

Why that is exact: a frame sent at ``t >= min`` arrives at ``t + delay >= until``, so nothing
can still arrive inside a granted window once its frames are all in; the events of one node run
in the key order of :mod:`rocev2_emu.runtime.events`, which no split changes.  Idle stretches
cost one round (the minimum jumps to the next event, wherever it is).  A round that could not
move ``until`` (a process holds its clock at ``now`` for an out-of-band wait) is not granted:
the coordinator waits for a report that changes it - or, from a process that is not held and has
work before the end of the window it holds (woken while it waited: a report is a promise, so it
ran nothing), grants that window again to it alone.  A process whose application decides in wall
time (a torch rank between collectives) reports ``busy`` as well as held: no stall is declared
while one is; ``done`` says its application has finished (:meth:`Coordinator.apps_done`).

**The wire**: a frame between processes is the VXLAN datagram of the process mode, unchanged,
followed by a 16-byte trailer - its arrival time (IEEE 754 double, emulated seconds, the exact
value the sender's heap computed) and the link's sequence number (unsigned 64-bit) - both in
network byte order.  A trailer and not a header: everything from the VXLAN header to the ICRC
stays where Wireshark expects it (the trailer shows as the Ethernet frame's trailer), and the
frame's own bytes are what the virtual run carries.  The receiver checks that each link's
sequence numbers come in order with no gap; a gap, a datagram from the wrong sender, or a
malformed one stops the run naming the link (no silently different result).

**Changes to the fabric** happen at emulated instants, never at a wall-clock moment: a process
asks for one (:class:`LinkChange`: links between named nodes down or up at time ``at``) with its
report; the coordinator refuses one whose instant a granted window has already passed, bounds
the next window at ``at + lookahead`` and hands the change to every process with that window's
grant.  Each process applies it when its engine reaches ``at`` (a switch: its ports on those
links, and routes converged around every link down), so the change is one event of the run,
seen everywhere at the same instant.
"""

from __future__ import annotations

import math
import os
import select
import shutil
import socket
import struct
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Final, Protocol, TextIO

import msgpack
import trio

from rocev2_emu.control.channel import _LEN as LENGTH
from rocev2_emu.control.channel import (
    MAX_MESSAGE,
    ControlError,
    MessageChannel,
    _authenticate,
    admit,
    connection_limit,
)
from rocev2_emu.control.kvstore import STORE_LATENCY, StoreCore, StoreOp
from rocev2_emu.runtime.link import faults_from_request

TRAILER: Final = struct.Struct("!dQ")  # arrival time (emulated s), the link's sequence number


# where a node process finds the coordinator: (host, port), or the path of its Unix socket
# (a local run's: cheaper per message than loopback TCP)
SyncAddress = tuple[str, int] | str


def sync_label(address: SyncAddress) -> str:
    """``address`` as ``node --sync`` takes it and messages name it: HOST:PORT or the path."""
    return address if isinstance(address, str) else f"{address[0]}:{address[1]}"


class SyncError(Exception):
    """The synchronised run cannot go on (a dead or silent process, a broken link); ``node``:
    the process it is about, when one is to blame (its own last error line explains it)."""

    def __init__(self, message: str, node: str | None = None) -> None:
        super().__init__(message)
        self.node = node


class RunOver(Exception):
    """The coordinator ended the run normally (its job is done)."""


DONE: Final = "done"  # the stop reason of a run that ended normally


def ended_normally(exc: BaseException) -> bool:
    """``exc`` (what a process's trio run raised) is the coordinator's end of the run, a
    RunOver alone or in groups, and nothing else."""
    if isinstance(exc, BaseExceptionGroup):
        over, rest = exc.split(RunOver)
        return over is not None and rest is None
    return isinstance(exc, RunOver)


def with_trailer(datagram: bytes, at: float, seq: int) -> bytes:
    return datagram + TRAILER.pack(at, seq)


def split_trailer(datagram: bytes | memoryview) -> tuple[bytes, float, int]:
    """(the datagram, its arrival time, its sequence number); ValueError if too short."""
    n = len(datagram) - TRAILER.size
    if n <= 0:
        raise ValueError(f"a {len(datagram)}-byte datagram has no room for the sync trailer")
    at, seq = TRAILER.unpack_from(datagram, n)
    if not math.isfinite(at) or at < 0:
        raise ValueError(f"arrival time {at!r} in the sync trailer")
    return bytes(datagram[:n]), at, seq


# -- the clock hold of out-of-band waits ---------------------------------------------------


class Holdable(Protocol):
    """What holds its clock during out-of-band waits (the exact engine)."""

    def hold(self) -> None: ...

    def release(self) -> None: ...


_HOLDER: trio.lowlevel.RunVar[Holdable | None] = trio.lowlevel.RunVar("exact_holder", None)


def set_holder(holder: Holdable | None) -> None:
    """This trio run's engine, whose clock out-of-band waits hold (None: no synchronised
    engine here; holds are no-ops)."""
    _HOLDER.set(holder)


@contextmanager
def holding_clock() -> Iterator[None]:
    """Around an out-of-band wait (a control request, the rendezvous store): while it lasts,
    this process's emulated clock does not move past now, so whatever the answer's wall-clock
    arrival, it is seen at the same emulated instant.  A no-op outside an exact run."""
    try:
        holder = _HOLDER.get()
    except RuntimeError:  # not inside trio.run
        holder = None
    if holder is None:
        yield
        return
    holder.hold()
    try:
        yield
    finally:
        holder.release()


# -- the coordinator -----------------------------------------------------------------------


MAX_CHANGE_LINKS: Final = 4096  # links in one change (a bound on what a report may carry)


@dataclass(slots=True, frozen=True)
class LinkChange:
    """The links between the named nodes go down (``up`` False) or come back at ``at`` (None:
    as soon as the run can take it - a change from outside the run, ``rocev2-emu link`` or the
    map; the coordinator gives it the instant its windows have reached).  With ``faults`` it
    changes the links' faults instead (both directions; the settings of
    :class:`~rocev2_emu.runtime.link.LinkFaults`, ``up`` unused)."""

    at: float | None
    pairs: tuple[tuple[str, str], ...]
    up: bool
    faults: tuple[tuple[str, float], ...] | None = None  # sorted (field, value) pairs

    def wire(self) -> list[Any]:
        item = [self.at, [list(p) for p in self.pairs], self.up]
        return item if self.faults is None else [*item, dict(self.faults)]

    def at_instant(self, at: float) -> LinkChange:
        return LinkChange(at, self.pairs, self.up, self.faults)

    @classmethod
    def from_wire(cls, item: Any) -> LinkChange:
        """A change as a process sent it, checked (ValueError names what is wrong)."""
        if not isinstance(item, list | tuple) or len(item) not in (3, 4):
            raise ValueError(f"a link change is [at, [[a, b], ...], up(, faults)]: {item!r:.80}")
        at, pairs, up = item[:3]
        if at is not None and (not isinstance(at, int | float) or not math.isfinite(at) or at < 0):
            raise ValueError(f"link change time {at!r:.40}")
        if not isinstance(up, bool) or not isinstance(pairs, list | tuple):
            raise ValueError(f"a link change's links or state: {item!r:.80}")
        if not 0 < len(pairs) <= MAX_CHANGE_LINKS or not all(
            isinstance(pair, list | tuple)
            and len(pair) == 2
            and all(isinstance(n, str) for n in pair)
            for pair in pairs
        ):
            raise ValueError(f"a link change names 1 to {MAX_CHANGE_LINKS} [a, b] node pairs")
        faults = None
        if len(item) == 4:
            faults = change_faults(item[3])
        when = None if at is None else float(at)
        return cls(when, tuple((str(a), str(b)) for a, b in pairs), up, faults)


def change_faults(settings: Any) -> tuple[tuple[str, float], ...]:
    """Fault settings of a change, checked as a link's are (ValueError names the field)."""
    faults_from_request(settings)
    return tuple(sorted((str(k), float(v)) for k, v in settings.items()))


@dataclass(slots=True)
class Report:
    """One process's report at the end of a window."""

    next_time: float  # its next event, deadline or held instant; inf: none
    quiet: bool  # no frame event or core deadline on its heap, nothing in flight from it
    sent: dict[str, int]  # frames sent to each other process since the start
    received: int  # frames received since the start
    window: int = 0  # how many windows it had been granted when it reported
    strays: int = 0  # datagrams from addresses that are no peer's, dropped since the start
    store: list[StoreOp] = field(default_factory=list)  # operations for the store
    changes: list[LinkChange] = field(default_factory=list)  # changes to the fabric it asks for

    @classmethod
    def from_wire(cls, msg: Any) -> Report:
        """A report as a node sent it, each field checked (ValueError names it)."""
        if not isinstance(msg, dict):
            raise ValueError(f"a sync report must be a map, not {type(msg).__name__}")
        try:
            next_time = float(msg["next"])
            quiet = bool(msg["quiet"])
            sent = {str(k): int(v) for k, v in dict(msg["sent"]).items()}
            received = int(msg["received"])
            window = int(msg["window"])
            strays = int(msg.get("strays", 0))
            store = [StoreOp.from_wire(op) for op in msg.get("store", ())]
            changes = [LinkChange.from_wire(c) for c in msg.get("changes", ())]
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"a sync report's field is missing or wrong: {exc!r}") from exc
        if math.isnan(next_time):
            raise ValueError("a sync report's next time is NaN")
        return cls(next_time, quiet, sent, received, window, strays, store, changes)


@dataclass(slots=True)
class Window:
    """What the coordinator decided for one round."""

    until: float
    quiet: bool = False  # nothing left in the fabric (only application deadlines, or none)
    # each process's due frames by sender: {receiver: {sender: frames sent it so far}}
    sources: dict[str, dict[str, int]] = field(default_factory=dict)

    def frames_due(self, name: str) -> int:
        """How many frames process ``name`` must have received before it runs the window."""
        return sum(self.sources.get(name, {}).values())


def next_window(reports: dict[str, Report], lookahead: float) -> Window:
    """The window every process may run once each has reported (see the module)."""
    earliest = min((r.next_time for r in reports.values()), default=math.inf)
    sources: dict[str, dict[str, int]] = {name: {} for name in reports}
    for sender, r in reports.items():
        for peer, n in r.sent.items():
            if peer in sources and n:
                sources[peer][sender] = n
    window = Window(earliest + lookahead, sources=sources)
    window.quiet = all(r.quiet for r in reports.values()) and all(
        r.received == window.frames_due(name) for name, r in reports.items()
    )
    return window


STALL_SECONDS: Final = 60.0  # wall seconds without a round that moves: the run stops
# Between windows a node process waits for its grant in the kernel, trio standing still, when
# nothing else can happen in it meanwhile (rocev2_emu.runtime.exact.ExactEngine._barrier) - at
# most BLOCK_SECONDS at a time, and only if trio has run its tasks within TRIO_EVERY (control
# requests and threads' calls are served at least that often); otherwise, or if no grant came,
# it waits in trio.
TRIO_EVERY: Final = 0.02  # wall seconds
BLOCK_SECONDS: Final = 0.01  # wall seconds


class Coordinator:
    """The windows of a synchronised run, for ``names`` (every process of the fabric), on the
    real clock.  Nodes connect (:func:`~rocev2_emu.control.channel.open_channel`, proving the
    fabric's secret), say ``{"hello": name, "origin": [host index, ...]}`` (the hosts whose
    store operations it sends), then report and wait for each window.  While :attr:`held` (a
    job setting up, or reading counters) no window is granted."""

    def __init__(
        self,
        names: list[str],
        lookahead: float,
        secret: bytes,
        *,
        pace: float | None = None,
        progress: TextIO | None = None,
    ) -> None:
        """``pace``: wall seconds per emulated second at least (``--pace N``: a run that could
        go faster waits, one that cannot keeps its own speed - either way the same events);
        ``progress``: a terminal for the progress line (None: no line)."""
        if pace is not None and not pace > 0:
            raise ValueError(f"--pace {pace!r}: wall seconds per emulated second, > 0")
        self.pace = pace
        self.progress = progress
        self._anchor: tuple[float, float] | None = None  # (emulated, wall) where pacing began
        self._shown = 0.0  # when the progress line was last written (wall)
        self._started = (0.0, 0.0)  # (emulated, wall) of the first progress line
        self._width = 0
        self.holder = ""  # the process whose next event bounded the last window
        lookahead = min(lookahead, STORE_LATENCY)
        if not lookahead > 0:
            raise ValueError(
                f"lookahead {lookahead!r}: a link between processes needs a delay > 0 for an "
                "exact run (give every link a delay)"
            )
        self.names = list(names)
        self.address: tuple[str, int] | None = None  # where it listens, once serving
        self.lookahead = lookahead
        self.secret = secret
        self.until = -math.inf  # the last window granted
        self.rounds = 0
        self.skipped = 0  # grants not sent: the process had nothing to do in the window
        self.held = True
        self.finished = False
        self.now = 0.0  # the earliest next time of the last round (emulated time reached)
        self.reports: dict[str, Report] = {}
        self.connected = trio.Event()
        self.quiet = trio.Event()  # set by a round that found the fabric quiet
        self._chans: dict[str, Any] = {}
        self._changed = trio.Event()
        self._deciding = False  # a round is being decided and granted
        self._again = False  # and another was asked for meanwhile
        self._complete = 0  # reports that completed a round
        self._moved_at = 0.0  # when the last did (trio's clock: wall seconds)
        self._holding: set[str] = set()
        self._busy: set[str] = set()  # processes whose application decides in wall time
        self._done: set[str] = set()  # processes whose application has finished
        self._done_changed = trio.Event()
        self._poll = False
        self._granted: dict[str, int] = {}  # windows sent to each process
        self.store = StoreCore()  # the rendezvous store, a node of the run
        self._origins: dict[int, str] = {}  # a host's index -> its process
        self._changes: list[LinkChange] = []  # asked for, not yet handed out

    def hold(self) -> None:
        """No window from now on until :meth:`release` (those granted still run)."""
        self.held = True

    async def apps_done(self, names: list[str]) -> None:
        """Until the applications of processes ``names`` have all finished
        (:meth:`~rocev2_emu.runtime.exact.ExactEngine.finished`)."""
        while not set(names) <= self._done:
            await self._done_changed.wait()
            self._done_changed = trio.Event()

    def missing(self) -> list[str]:
        """The processes that have not joined yet."""
        return sorted(set(self.names) - set(self._chans))

    def summary(self) -> str:
        """How the run was synchronised: its windows, and how many processes each woke."""
        n = len(self.names)
        woken = (self.rounds * n - self.skipped) / self.rounds if self.rounds else 0.0
        said = f"{self.rounds} windows, {woken:.1f} of {n} processes woken per window"
        strays = {name: r.strays for name, r in sorted(self.reports.items()) if r.strays}
        if strays:
            who = ", ".join(f"{name} {count}" for name, count in strays.items())
            said += f"; {sum(strays.values())} datagrams from no peer dropped ({who})"
        return said

    async def finish(self) -> None:
        """The job is done: tell every node (each exits quietly)."""
        self.held = True
        self.finished = True  # from now on a process that goes away has simply ended
        self.clear_progress()
        for chan in list(self._chans.values()):
            with trio.move_on_after(5.0):
                await chan.send({"stop": DONE})

    def release(self) -> None:
        """Windows again.  First every process is polled (an empty window) so that it reports
        afresh: what the job set up while the clock was held (a flow's start) is in it."""
        self.held = False
        self._poll = True
        self.quiet = trio.Event()
        self._changed.set()

    async def serve(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        local: bool = False,
        task_status: trio.TaskStatus[SyncAddress] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Listen on ``host:port`` (0: a free loopback port), take every node, then run rounds
        until cancelled; a node that goes away or stays silent is a SyncError naming it.
        ``task_status`` gets where the nodes connect: that address, or with ``local`` (node
        processes on this machine) the path of a Unix socket listened on as well, in a fresh
        directory removed afterwards - a report or a grant costs about half the CPU of one
        over loopback TCP, and a window costs every process both."""
        listeners: list[trio.SocketListener] = await trio.open_tcp_listeners(port, host=host)
        address = listeners[0].socket.getsockname()
        self.address = (address[0], address[1])
        where: SyncAddress = self.address
        folder = tempfile.mkdtemp(prefix="rocev2-emu-sync-") if local else None
        try:
            if folder is not None:
                where = os.path.join(folder, "coordinator")
                sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                await sock.bind(where)
                sock.listen(len(self.names) + 16)
                listeners.append(trio.SocketListener(sock))
            async with trio.open_nursery() as nursery:
                # every process once, and a few more: a stranger's sockets are closed, oldest
                # first, and cannot hold the coordinator's files (or a node) up
                handler = connection_limit(self._connection, len(self.names) + 16)
                nursery.start_soon(trio.serve_listeners, handler, listeners)
                task_status.started(where)
                await self._rounds()
        finally:
            if folder is not None:
                shutil.rmtree(folder, ignore_errors=True)

    async def _connection(self, stream: trio.SocketStream) -> None:
        chan = MessageChannel(stream, timeout=STALL_SECONDS)
        name = None
        mine: SyncLink | None = None  # this connection's, once it is a node's
        try:
            if not await _authenticate(chan, self.secret) or not admit():
                return
            hello = await chan.recv()
            name = hello.get("hello") if isinstance(hello, dict) else None
            if name not in self.names or name in self._chans:
                await chan.send({"stop": f"{name!r} is not a node of this run, or came twice"})
                return
            origins = hello.get("origin")  # the host index(es) whose store operations it sends
            for origin in origins if isinstance(origins, list) else [origins]:
                if isinstance(origin, int) and not isinstance(origin, bool):
                    self._origins[origin] = name
            link = mine = SyncLink(chan)
            self._chans[name] = link
            if len(self._chans) == len(self.names):
                self.connected.set()
            while True:
                msg = await link.recv()  # a node computing its window may be quiet for long
                try:
                    report = Report.from_wire(msg)
                except ValueError as exc:
                    raise SyncError(f"node {name}: {exc}") from exc
                for op in report.store:
                    if self._origins.get(op.origin) != name:
                        raise SyncError(f"node {name}: a store operation as host {op.origin}")
                    self.store.submit(op)
                self._take_changes(name, report.changes)
                if report.window != self._granted.get(name, 0):
                    # said before the node got its latest window (a re-report crossing a grant):
                    # its report of that window follows
                    continue
                self.reports[name] = report
                (self._holding.add if msg.get("held") else self._holding.discard)(name)
                (self._busy.add if msg.get("busy") else self._busy.discard)(name)
                if msg.get("done") and name not in self._done:
                    self._done.add(name)
                    self._done_changed.set()
                if len(self.reports) == len(self.names):  # the round may be decided: here,
                    self._complete += 1  # with no hand-over to another task on the path of
                    self._moved_at = trio.current_time()
                    await self._round()  # every window
        except ControlError as exc:
            if name in self._chans and not self.finished:
                raise SyncError(f"node {name} went away ({exc})", name) from exc
        finally:
            with trio.CancelScope(shield=True):
                if mine is not None:
                    await mine.aclose()
                else:
                    await chan.aclose()

    def _take_changes(self, name: str, changes: list[LinkChange]) -> None:
        """Changes to the fabric node ``name`` asked for, to hand out with the next window (one
        without an instant gets the first no process has passed); a SyncError if the run has
        already passed one's instant."""
        for change in changes:
            if change.at is None:
                change = change.at_instant(max(self.until, 0.0))
            elif change.at < self.until:
                raise SyncError(
                    f"node {name}: a link change at t={change.at * 1e6:.3f} us comes after the "
                    f"run reached {self.until * 1e6:.3f} us (ask at least one lookahead ahead "
                    "of now)"
                )
            self._changes.append(change)
            self._changed.set()  # a round to hand it out, even in an idle fabric

    async def _rounds(self) -> None:
        """Rounds that no report completes (a release, a change, a round decided while the
        last was still being granted), and the watch for a stall."""
        await self.connected.wait()
        self._moved_at = trio.current_time()
        while True:
            with trio.move_on_at(self._moved_at + STALL_SECONDS):
                await self._changed.wait()
            now = trio.current_time()
            if self.held or self._busy:
                # (an application deciding in wall time - a training script computing - may
                # take as long as it takes: its process is alive, its connection open)
                self._moved_at = now
            elif now >= self._moved_at + STALL_SECONDS:  # since the last round that completed,
                raise SyncError(self._stalled())  # not since the watch last looked
            if self._changed.is_set():
                self._changed = trio.Event()
                await self._round()

    async def _round(self) -> None:
        """Decide the next round if it can be and grant it (one decision at a time: one asked
        for meanwhile - a report that completes a round while a grant waits for room - is
        taken by :meth:`_rounds` next)."""
        if self._deciding:
            self._again = True
            return
        self._deciding = True
        try:
            await self._decide()
        finally:
            self._deciding = False
            if self._again:
                self._again = False
                self._changed.set()

    async def _decide(self) -> None:
        if self.held or len(self.reports) < len(self.names):
            return
        window = next_window(self.reports, self.lookahead)
        store_next = self.store.next_time()
        if store_next is not None:
            window.until = min(window.until, store_next + self.lookahead)
            window.quiet = False
        if self._changes:
            window.quiet = False
        if self._poll:
            self._poll = False
            window.until, window.quiet = max(self.until, 0.0), False
            await self._grant(window, everyone=True)
            return
        if window.quiet:
            self.quiet.set()
        if window.until <= self.until:
            # nothing can move (a held clock): wait for a report that changes it - or one
            # from a process that has work before the end of the window it was granted
            # (its clock held or paused until then, or woken while it waited): the same
            # window again, for it alone
            again = [
                name
                for name, report in self.reports.items()
                if report.next_time < self.until and name not in self._holding
            ]
            if again:
                await self._grant_again(again, window)
            return
        self.now = window.until - self.lookahead
        await self._paced(window.until)
        self._show()
        await self._grant(window)

    async def _paced(self, until: float) -> None:
        """With a pace: wait until the wall clock lets the run reach ``until`` (emulated)."""
        if self.pace is None:
            return
        wall = trio.current_time()  # the supervisor's trio runs on the real clock
        if self._anchor is None:
            self._anchor = (self.now, wall)
        emulated0, wall0 = self._anchor
        due = wall0 + (until - emulated0) * self.pace
        if due > wall:
            await trio.sleep(due - wall)

    def _show(self) -> None:
        """The progress line, at most twice a second: emulated time reached, emulated
        microseconds per wall second, and the process that bounds the windows."""
        if self.progress is None:
            return
        wall = time.monotonic()
        if wall - self._shown < 0.5:
            return
        if not self._shown:
            self._started = (self.now, wall)
        self._shown = wall
        if self.reports:  # the process whose next event bounds the windows now
            self.holder = min(self.reports, key=lambda n: self.reports[n].next_time)
        emulated0, wall0 = self._started
        rate = (self.now - emulated0) / max(wall - wall0, 1e-9)
        line = (
            f"clock: exact, {self.now * 1e6:,.1f} us emulated, {rate * 1e6:,.1f} us per wall s, "
            f"{self.rounds} windows, bounded by {self.holder}"
            + (f", paced at {self.pace:g} s per emulated s" if self.pace else "")
        )
        self.progress.write("\r" + line.ljust(self._width))
        self.progress.flush()
        self._width = len(line)

    def clear_progress(self) -> None:
        """Clear the progress line (the run's own output follows)."""
        if self.progress is not None and self._width:
            self.progress.write("\r" + " " * self._width + "\r")
            self.progress.flush()
            self._width = 0

    def _stalled(self) -> str:
        """Why no window moved for STALL_SECONDS: the processes it waits for, or the one whose
        report holds the windows back."""
        where = f"at emulated t={self.now * 1e6:.3f} us"
        missing = sorted(set(self.names) - set(self.reports))
        if missing:
            late = ", ".join(missing)
            return f"no progress for {STALL_SECONDS:g} s (wall): no report from {late} {where}"
        if self._holding:
            return (
                f"no progress for {STALL_SECONDS:g} s (wall): {', '.join(sorted(self._holding))} "
                f"waits out of band (its clock held) {where}"
            )
        first = min(self.reports, key=lambda n: self.reports[n].next_time)
        report = self.reports[first]
        store = self.store.next_time()
        return (
            f"no progress for {STALL_SECONDS:g} s (wall): {first}'s next event at "
            f"t={report.next_time * 1e6:.3f} us holds the windows (until "
            f"{self.until * 1e6:.3f} us) {where}; received {report.received}, quiet {report.quiet}"
            + ("" if store is None else f"; the store's next operation at t={store * 1e6:.3f} us")
        )

    async def _send(self, name: str, grant: dict[str, Any]) -> None:
        try:
            await self._chans[name].send(grant)
        except ControlError as exc:
            raise SyncError(f"node {name} went away ({exc})", name) from exc

    async def _grant_again(self, names: list[str], window: Window) -> None:
        """The window granted last, again, to processes ``names`` only: they report again."""
        self.rounds += 1
        for name in names:
            del self.reports[name]
            self._granted[name] = self._granted.get(name, 0) + 1
            grant = {"until": self.until, "expect": window.sources.get(name, {})}
            await self._send(name, grant)

    async def _grant(self, window: Window, *, everyone: bool = False) -> None:
        """Send the window to every process that has something to do in it: a process whose
        next event comes after it, that is owed no frame and no store reply, would only report
        the same again - it keeps its report and is not woken (``everyone``: all are)."""
        changes: list[list[Any]] = []
        if self._changes and not everyone:  # a poll's window is empty: not in it
            # handed out with this window, which ends one lookahead after the first at the
            # latest (bounded here, not when the round was decided: a change may have come
            # while the window waited for its pace)
            first = min(c.at for c in self._changes if c.at is not None)
            window.until = min(window.until, first + self.lookahead)
            changes, self._changes = [c.wire() for c in self._changes], []
        self.until = window.until
        self.rounds += 1
        replies: dict[str, list[list[Any]]] = {}
        for reply in self.store.run_until(window.until):
            replies.setdefault(self._origins[reply.origin], []).append(reply.wire())
        everyone = everyone or bool(changes)
        reports, self.reports = self.reports, {}
        woken = 0
        for name in self._chans:
            report = reports.get(name)
            if (
                not everyone
                and report is not None
                and report.next_time >= window.until
                and report.received == window.frames_due(name)
                and name not in replies
                and name not in self._holding
            ):
                self.reports[name] = report
                self.skipped += 1
                continue
            grant: dict[str, Any] = {"until": window.until, "expect": window.sources.get(name, {})}
            if name in replies:
                grant["store"] = replies[name]
            if changes:
                grant["changes"] = changes
            self._granted[name] = self._granted.get(name, 0) + 1
            woken += 1
            await self._send(name, grant)
        if not woken:
            # nobody had anything to do before the window's end (a store operation bounded it,
            # and gave no reply yet): no report will come, so decide the next round now
            self._changed.set()


class SyncLink:
    """A sync connection once its handshake is done: the same length-prefixed msgpack as
    :class:`~rocev2_emu.control.channel.MessageChannel`, on the connection's socket directly.
    A window costs every process one report and one grant, and trio's scheduling passes
    around each were most of an exact run's time: a send here never yields (a report or a grant
    fits the socket buffer; a full one waits), a receive yields only when nothing is there."""

    def __init__(self, chan: MessageChannel) -> None:
        stream = chan.stream
        if not isinstance(stream, trio.SocketStream):
            raise TypeError("a sync link runs over a socket connection")
        self.chan = chan  # owns the connection (closed with it)
        self.sock = socket.socket(fileno=os.dup(stream.socket.fileno()))
        self.sock.setblocking(False)
        self._buf = bytearray(chan._buf)  # what the handshake read ahead
        chan._buf.clear()
        self._chunk = bytearray(65536)  # what one read takes (no 64 KiB object per read)
        self._chunk_view = memoryview(self._chunk)
        self._poller = select.poll()  # for recv_blocking
        self._poller.register(self.sock, select.POLLIN)

    async def send(self, obj: Any) -> bool:
        """Send ``obj``; True if it had to wait for room (trio ran other tasks meanwhile)."""
        body = msgpack.packb(obj, use_bin_type=True)
        data = memoryview(LENGTH.pack(len(body)) + body)
        waited = False
        while data:
            try:
                sent = self.sock.send(data)
            except BlockingIOError:
                await trio.lowlevel.wait_writable(self.sock)
                waited = True
                continue
            except OSError as exc:
                raise ControlError(f"sync peer went away: {exc}") from exc
            data = data[sent:]
        return waited

    def _message(self) -> tuple[bool, Any]:
        """(True, the next whole message) if the buffer holds one, else (False, None)."""
        buf = self._buf
        if len(buf) >= LENGTH.size:
            (n,) = LENGTH.unpack_from(buf)
            if n > MAX_MESSAGE:
                raise ControlError(f"a sync message of {n} bytes (> {MAX_MESSAGE})")
            if len(buf) >= LENGTH.size + n:
                body = bytes(buf[LENGTH.size : LENGTH.size + n])
                del buf[: LENGTH.size + n]
                try:
                    return True, msgpack.unpackb(body, raw=False)
                except Exception as exc:  # msgpack raises several types
                    raise ControlError(f"malformed sync message: {exc}") from exc
        return False, None

    def _read(self) -> bool:
        """What the socket holds into the buffer; False if it held nothing yet."""
        try:
            n = self.sock.recv_into(self._chunk)
        except BlockingIOError:
            return False
        except OSError as exc:
            raise ControlError(f"sync peer went away: {exc}") from exc
        if not n:
            raise ControlError("sync peer closed the connection")
        self._buf += self._chunk_view[:n]
        return True

    async def recv(self) -> Any:
        while True:
            whole, msg = self._message()
            if whole:
                return msg
            if not self._read():
                await trio.lowlevel.wait_readable(self.sock)

    def watch(self, fd: int) -> None:
        """A file that interrupts :meth:`recv_blocking` when it becomes readable (a request
        for trio from another thread)."""
        self._poller.register(fd, select.POLLIN)

    def recv_blocking(self, timeout: float) -> tuple[bool, Any]:
        """(True, the next message) if one comes within ``timeout`` wall seconds, waiting in
        the kernel with trio standing still (no other task runs, nothing else is served
        meanwhile); (False, None) if none came, or a watched file became readable - the
        caller then waits in trio."""
        deadline = time.monotonic() + timeout
        mine = self.sock.fileno()
        while True:
            whole, msg = self._message()
            if whole:
                return True, msg
            if self._read():
                continue
            left = deadline - time.monotonic()
            ready = self._poller.poll(left * 1000.0) if left > 0 else []
            if not ready or any(fd != mine for fd, _ in ready):
                return False, None

    async def aclose(self) -> None:
        self.sock.close()
        await self.chan.aclose()
