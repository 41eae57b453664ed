"""The coordinator of an exact run, on the real clock: the trio shell around the decisions of
:class:`~rocev2_emu.runtime.rounds.Rounds`.

It listens for the node processes, takes each one's
:class:`~rocev2_emu.runtime.sync_messages.Hello` and then its reports, asks the decisions for
each round and sends the grants; it paces the windows (``--pace``), draws the progress line,
and stops the run naming the process it waits for when nothing moved for
:data:`~rocev2_emu.runtime.rounds.STALL_SECONDS` (a process computing a long window beats, and is
not taken for one that stopped).  One connection per process, plus a few a
stranger may open (closed oldest first).
"""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
import time
from typing import Any, Protocol, TextIO

import trio

from rocev2_emu.control.channel import (
    ControlError,
    MessageChannel,
    admit,
    authenticate,
    connection_limit,
)
from rocev2_emu.runtime.rounds import STALL_SECONDS, Plan, Rounds
from rocev2_emu.runtime.sync import SyncAddress
from rocev2_emu.runtime.sync_link import SyncLink
from rocev2_emu.runtime.sync_messages import (
    DONE,
    Grant,
    Hello,
    LinkChange,
    Report,
    Stop,
    SyncError,
    is_beat,
    process_label,
)


class Outbox(Protocol):
    """Where a process's grants go: its :class:`SyncLink` (or a test's stand-in)."""

    async def send(self, obj: Any) -> bool: ...


class Coordinator:
    """The windows of a synchronised run, for ``names`` (every process of the fabric), on the
    real clock (see the module).  Its decisions are :attr:`decisions`; while they are held (a
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
        self.decisions = Rounds(names, lookahead)
        self.names = self.decisions.names
        self.lookahead = self.decisions.lookahead
        self.secret = secret
        self.pace = pace
        self.progress = progress
        self.address: tuple[str, int] | None = None  # where it listens, once serving
        self.finished = False
        self.connected = trio.Event()
        self.quiet = trio.Event()  # set by a round that found the fabric quiet
        self.links: dict[str, Outbox] = {}  # each process's connection, once it joined
        self.moved_at = 0.0  # when the last round completed (trio's clock: wall seconds)
        self.anchor: tuple[float, float] | None = None  # (emulated, wall) where pacing began
        self._changed = trio.Event()
        self._deciding = False  # a round is being decided and granted
        self._again = False  # and another was asked for meanwhile
        self._done_changed = trio.Event()
        self._shown = 0.0  # when the progress line was last written (wall)
        self._started = (0.0, 0.0)  # (emulated, wall) of the first progress line
        self._width = 0

    # -- what the job does -------------------------------------------------------------------
    def hold(self) -> None:
        """No window from now on until :meth:`release` (those granted still run)."""
        self.decisions.hold()

    def release(self) -> None:
        """Windows again, from a poll of every process (:meth:`Rounds.release`)."""
        self.decisions.release()
        self.quiet = trio.Event()
        self._changed.set()

    @property
    def now(self) -> float:
        """The emulated time the run has reached."""
        return self.decisions.now

    async def apps_done(self, names: list[str]) -> None:
        """Until the applications of processes ``names`` have all finished
        (:meth:`~rocev2_emu.runtime.exact.ExactEngine.finished`)."""
        while not set(names) <= self.decisions.done:
            await self._done_changed.wait()
            self._done_changed = trio.Event()

    def missing(self) -> list[str]:
        """The processes that have not joined yet."""
        return sorted(set(self.names) - self.decisions.joined)

    def summary(self) -> str:
        return self.decisions.summary()

    async def finish(self) -> None:
        """The job is done: tell every node (each exits quietly)."""
        self.decisions.hold()
        self.finished = True  # from now on a process that goes away has simply ended
        self.clear_progress()
        for link in list(self.links.values()):
            with trio.move_on_after(5.0):
                await link.send(Stop(DONE).wire())

    # -- the nodes ---------------------------------------------------------------------------
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
                await self.run_rounds()
        finally:
            if folder is not None:
                shutil.rmtree(folder, ignore_errors=True)

    async def _connection(self, stream: trio.SocketStream) -> None:
        chan = MessageChannel(stream, timeout=STALL_SECONDS)
        name = None
        mine: SyncLink | None = None  # this connection's, once it is a node's
        try:
            if not await authenticate(chan, self.secret) or not admit():
                return
            try:
                hello = Hello.from_wire(await chan.recv())
            except ValueError as exc:
                await chan.send(Stop(str(exc)).wire())
                return
            refused = self.decisions.join(hello.name, hello.origins)
            if refused is not None:
                await chan.send(Stop(refused).wire())
                return
            name = hello.name
            mine = SyncLink(chan)
            self.attach(name, mine)
            while True:
                msg = await mine.recv()  # a node computing its window beats (is_beat)
                if is_beat(msg):
                    self.beat(name)
                    continue
                try:
                    report = Report.from_wire(msg)
                except ValueError as exc:
                    raise SyncError(f"node {process_label(name)}: {exc}") from exc
                await self.take(name, report)
        except ControlError as exc:
            if name in self.links and not self.finished:
                raise SyncError(f"node {process_label(name)} went away ({exc})", name) from exc
        finally:
            with trio.CancelScope(shield=True):
                if mine is not None:
                    await mine.aclose()
                else:
                    await chan.aclose()

    def attach(self, name: str, link: Outbox) -> None:
        """Process ``name`` joined (:meth:`Rounds.join`): its grants go on ``link``."""
        self.decisions.joined.add(name)
        self.links[name] = link
        if len(self.links) == len(self.names):
            self.connected.set()

    async def take(self, name: str, report: Report) -> None:
        """Process ``name``'s report: the round it completes is decided here, with no hand-over
        to another task on the path of every window."""
        complete = self.decisions.take(name, report)
        if report.changes:
            self._changed.set()  # a round to hand them out, even in an idle fabric
        if report.done:
            self._done_changed.set()
        if complete:
            self.moved_at = trio.current_time()
            await self.round()

    def beat(self, name: str) -> None:
        """Process ``name`` is still computing its window (:meth:`Rounds.beat`)."""
        self.decisions.beat(name, trio.current_time())

    def ask(self, name: str, changes: list[LinkChange]) -> None:
        """Changes to the fabric on behalf of process ``name``, handed out with the next
        window (:meth:`Rounds.ask`); a round hands them out even in an idle fabric."""
        if self.decisions.ask(name, changes):
            self._changed.set()

    # -- the rounds --------------------------------------------------------------------------
    async def run_rounds(self) -> None:
        """Rounds that no report completes (a release, a change, a round decided while the
        last was still being granted), and the watch for a stall."""
        await self.connected.wait()
        self.moved_at = trio.current_time()
        while True:
            with trio.move_on_at(self.moved_at + STALL_SECONDS):
                await self._changed.wait()
            now = trio.current_time()
            if self.decisions.held or self.decisions.busy:
                # (an application deciding in wall time - a training script computing - may
                # take as long as it takes: its process is alive, its connection open)
                self.moved_at = now
            elif (since := self.decisions.computing_since(now)) is not None:
                # (a window of thousands of nodes on a busy machine: the processes it waits
                # for beat; named STALL_SECONDS after the earliest of their last beats)
                self.moved_at = max(self.moved_at, since)
            elif now >= self.moved_at + STALL_SECONDS:  # since the last round that completed,
                raise SyncError(self.decisions.stalled(now))  # not since the watch last looked
            if self._changed.is_set():
                self._changed = trio.Event()
                await self.round()

    async def round(self) -> None:
        """Decide the next round if it can be and grant it (one decision at a time: one asked
        for meanwhile - a report that completes a round while a grant waits for room - is
        taken by :meth:`run_rounds` next)."""
        if self._deciding:
            self._again = True
            return
        self._deciding = True
        try:
            plan = self.decisions.plan()
            if plan is not None:
                await self._carry_out(plan)
        finally:
            self._deciding = False
            if self._again:
                self._again = False
                self._changed.set()

    async def _carry_out(self, plan: Plan) -> None:
        if plan.quiet:
            self.quiet.set()
        if plan.kind == "next":
            await self.paced(plan.window.until)
            self.show_progress()
        grants = self.decisions.grants(plan)
        for name, grant in grants:
            await self._send(name, grant)
        if not grants and plan.kind in ("next", "poll"):
            # nobody had anything to do before the window's end: decide the next round now
            self._changed.set()

    async def _send(self, name: str, grant: Grant) -> None:
        try:
            await self.links[name].send(grant.wire())
        except ControlError as exc:
            raise SyncError(f"node {process_label(name)} went away ({exc})", name) from exc

    async def paced(self, until: float) -> None:
        """With a pace: wait until the wall clock lets the run reach ``until`` (emulated),
        counted from where pacing began (:attr:`anchor`)."""
        if self.pace is None:
            return
        wall = trio.current_time()  # the supervisor's trio runs on the real clock
        if self.anchor is None:
            self.anchor = (self.decisions.now, wall)
        emulated0, wall0 = self.anchor
        due = wall0 + (until - emulated0) * self.pace
        if due > wall:
            await trio.sleep(due - wall)

    # -- the progress line -------------------------------------------------------------------
    def show_progress(self) -> None:
        """The progress line, at most twice a second: emulated time reached, emulated
        microseconds per wall second, and the process that bounds the windows."""
        if self.progress is None:
            return
        wall = time.monotonic()
        if wall - self._shown < 0.5:
            return
        now = self.decisions.now
        if not self._shown:
            self._started = (now, wall)
        self._shown = wall
        emulated0, wall0 = self._started
        rate = (now - emulated0) / max(wall - wall0, 1e-9)
        line = (
            f"clock: exact, {now * 1e6:,.1f} us emulated, {rate * 1e6:,.1f} us per wall s, "
            f"{self.decisions.rounds} windows, bounded by {self.decisions.bounding()}"
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
