"""The coordinator's decisions, sans-IO: reports in, grants out, and why a run stalls.

:class:`Rounds` holds what the coordinator of an exact run knows (each process's last report,
the windows granted, the changes to the fabric asked for, the emulated rendezvous store) and
decides each round by the rule of :mod:`rocev2_emu.runtime.sync`: :meth:`Rounds.take` a
:class:`~rocev2_emu.runtime.sync_messages.Report` (True when every process has reported),
:meth:`Rounds.plan` the next window, then :meth:`Rounds.grants` it - the
:class:`~rocev2_emu.runtime.sync_messages.Grant` of each process that has something to do in
it.  The trio shell (:class:`~rocev2_emu.runtime.coordinator.Coordinator`) moves the messages
and paces the windows; tests step this object by hand, as the DCQCN tests step a rate.  It
grows with the processes: one report, one count of windows and one origin set per process.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Final, Literal

from rocev2_emu.control.kvstore import STORE_LATENCY, StoreCore, StoreReply
from rocev2_emu.runtime.sync_messages import Grant, LinkChange, Report, SyncError, process_label

STALL_SECONDS: Final = 60.0  # wall seconds without a round that moves: the run stops


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


@dataclass(slots=True)
class Plan:
    """A round decided: ``poll`` (an empty window for every process, after a release),
    ``again`` (the last window again, for the processes in ``again`` only), ``next`` (a new
    window, granted once its pace allows) or ``wait`` (nothing can move: no grant until a
    report changes that).  ``quiet``: the round found the fabric quiet."""

    kind: Literal["poll", "again", "next", "wait"]
    window: Window
    again: list[str] = field(default_factory=list)
    quiet: bool = False


class Rounds:
    """The windows of a synchronised run of processes ``names`` (see the module).  While
    :attr:`held` (a job setting up, or reading counters) no window is decided."""

    def __init__(self, names: list[str], lookahead: float) -> None:
        lookahead = min(lookahead, STORE_LATENCY)
        if not lookahead > 0:
            raise ValueError(
                f"lookahead {lookahead!r}: a link between processes needs a delay > 0 for an "
                "exact run (give every link a delay)"
            )
        self.names = list(names)
        self.lookahead = lookahead
        self.until = -math.inf  # the last window granted
        self.rounds = 0
        self.skipped = 0  # grants not sent: the process had nothing to do in the window
        self.held = True
        self.now = 0.0  # the earliest next time of the last round (emulated time reached)
        self.reports: dict[str, Report] = {}
        self.joined: set[str] = set()
        self.holding: set[str] = set()  # processes whose clock an out-of-band wait holds
        self.busy: set[str] = set()  # processes whose application decides in wall time
        self.done: set[str] = set()  # processes whose application has finished
        self.beats: dict[str, float] = {}  # the last beat of each process computing a window
        self.granted: dict[str, int] = {}  # windows granted to each process
        self.store = StoreCore()  # the rendezvous store, a node of the run
        self.changes: list[LinkChange] = []  # asked for, not yet handed out
        self._poll = False
        self._origins: dict[int, str] = {}  # a host's index -> its process

    # -- what the processes say ------------------------------------------------------------
    def join(self, name: str, origins: tuple[int, ...]) -> str | None:
        """Process ``name`` joins, sending the store operations of hosts ``origins``; why it
        may not (not a process of the run, or joined already), or None."""
        if name not in self.names or name in self.joined:
            return f"{name!r} is not a node of this run, or came twice"
        self.joined.add(name)
        for origin in origins:
            self._origins[origin] = name
        return None

    @property
    def all_joined(self) -> bool:
        return len(self.joined) == len(self.names)

    def take(self, name: str, report: Report) -> bool:
        """Process ``name``'s report: its store operations and changes taken (a SyncError for
        one it may not send); True if it completes a round (every process has reported).  A
        report said before the process got its latest window (a re-report crossing a grant)
        only brings its operations: its report of that window follows."""
        for op in report.store:
            if self._origins.get(op.origin) != name:
                who = process_label(name)
                raise SyncError(f"node {who}: a store operation as host {op.origin}")
            self.store.submit(op)
        self.ask(name, report.changes)
        if report.window != self.granted.get(name, 0):
            return False
        self.reports[name] = report
        self.beats.pop(name, None)
        (self.holding.add if report.held else self.holding.discard)(name)
        (self.busy.add if report.busy else self.busy.discard)(name)
        if report.done:
            self.done.add(name)
        return len(self.reports) == len(self.names)

    def beat(self, name: str, wall: float) -> None:
        """Process ``name`` said at ``wall`` (the shell's clock, seconds) that it is still
        computing its window (:data:`~rocev2_emu.runtime.sync_messages.BEAT`)."""
        if name in self.joined:
            self.beats[name] = wall

    def computing_since(self, wall: float) -> float | None:
        """If every process the round waits for beat within STALL_SECONDS before ``wall``
        (they are computing their windows: the run is slow, not stalled), the earliest of those
        beats; else None."""
        missing = [name for name in self.names if name not in self.reports]
        if not missing:
            return None
        first = min(self.beats.get(name, -math.inf) for name in missing)
        return first if wall - first < STALL_SECONDS else None

    def ask(self, name: str, changes: list[LinkChange]) -> bool:
        """Changes to the fabric process ``name`` asked for, to hand out with the next window
        (one without an instant gets the first no process has passed); a SyncError if the run
        has already passed one's instant.  True if there were any (a round should hand them
        out, even in an idle fabric)."""
        for change in changes:
            if change.at is None:
                change = change.at_instant(max(self.until, 0.0))
            elif change.at < self.until:
                raise SyncError(
                    f"node {process_label(name)}: a link change at t={change.at * 1e6:.3f} us "
                    f"comes after the run reached {self.until * 1e6:.3f} us (ask at least one "
                    "lookahead ahead of now)"
                )
            self.changes.append(change)
        return bool(changes)

    # -- the decisions ---------------------------------------------------------------------
    def hold(self) -> None:
        """No window from now on until :meth:`release` (those granted still run)."""
        self.held = True

    def release(self) -> None:
        """Windows again.  First every process is polled (an empty window) so that it reports
        afresh: what the job set up while the clock was held (a flow's start) is in it."""
        self.held = False
        self._poll = True

    def plan(self) -> Plan | None:
        """The next round, if one can be decided now (not held, every process reported, and
        for a new window: one that moves past the last, else ``wait`` or ``again``)."""
        if self.held or len(self.reports) < len(self.names):
            return None
        window = next_window(self.reports, self.lookahead)
        store_next = self.store.next_time()
        if store_next is not None:
            window.until = min(window.until, store_next + self.lookahead)
            window.quiet = False
        if self.changes:
            window.quiet = False
        if self._poll:
            self._poll = False
            window.until, window.quiet = max(self.until, 0.0), False
            return Plan("poll", window)
        if window.until <= self.until:
            # nothing can move (a held clock): wait for a report that changes it - or one
            # from a process that has work before the end of the window it was granted
            # (its clock held or paused until then, or woken while it waited): the same
            # window again, for it alone
            again = [
                name
                for name, report in self.reports.items()
                if report.next_time < self.until and name not in self.holding
            ]
            return Plan("again" if again else "wait", window, again, window.quiet)
        self.now = window.until - self.lookahead
        return Plan("next", window, quiet=window.quiet)

    def grants(self, plan: Plan) -> list[tuple[str, Grant]]:
        """The grants of a planned round, to send in this order: for ``again``, the last
        window to its processes; otherwise the window to every process that has something to
        do in it - a process whose next event comes after it, that is owed no frame and no
        store reply, would only report the same again: it keeps its report and is not woken
        (after a poll or with changes, every process is).  No grant from a new window means
        nobody had anything to do before its end (a store operation bounded it and gave no
        reply yet): decide the next round at once."""
        window = plan.window
        if plan.kind == "wait":
            return []
        self.rounds += 1
        if plan.kind == "again":
            out = []
            for name in plan.again:
                del self.reports[name]
                self.granted[name] = self.granted.get(name, 0) + 1
                out.append((name, Grant(self.until, window.sources.get(name, {}))))
            return out
        everyone = plan.kind == "poll"
        changes: list[LinkChange] = []
        if self.changes and not everyone:  # a poll's window is empty: not in it
            # handed out with this window, which ends one lookahead after the first at the
            # latest (bounded here, not when the round was planned: a change may have come
            # while the window waited for its pace)
            first = min(c.at for c in self.changes if c.at is not None)
            window.until = min(window.until, first + self.lookahead)
            changes, self.changes = self.changes, []
        self.until = window.until
        replies: dict[str, list[StoreReply]] = {}
        for reply in self.store.run_until(window.until):
            replies.setdefault(self._origins[reply.origin], []).append(reply)
        everyone = everyone or bool(changes)
        reports, self.reports = self.reports, {}
        out = []
        for name in self.names:
            if name not in self.joined:
                continue
            report = reports.get(name)
            if (
                not everyone
                and report is not None
                and report.next_time >= window.until
                and report.received == window.frames_due(name)
                and name not in replies
                and name not in self.holding
            ):
                self.reports[name] = report
                self.skipped += 1
                continue
            self.granted[name] = self.granted.get(name, 0) + 1
            grant = Grant(
                window.until, window.sources.get(name, {}), replies.get(name, []), changes
            )
            out.append((name, grant))
        return out

    # -- what it tells -----------------------------------------------------------------------
    def bounding(self) -> str:
        """The process whose next event bounds the windows now ("" before any report)."""
        if not self.reports:
            return ""
        return min(self.reports, key=lambda n: self.reports[n].next_time)

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

    def stalled(self, wall: float = math.inf) -> str:
        """Why no window moved for STALL_SECONDS before ``wall``: the processes it waits for
        (not those still computing), or the one whose report holds the windows back."""
        where = f"at emulated t={self.now * 1e6:.3f} us"
        missing = sorted(set(self.names) - set(self.reports))
        if missing:
            alive = [n for n in missing if wall - self.beats.get(n, -math.inf) < STALL_SECONDS]
            late = ", ".join(process_label(n) for n in missing if n not in alive)
            also = f" ({len(alive)} other processes still computing)" if alive else ""
            return (
                f"no progress for {STALL_SECONDS:g} s (wall): no report from {late} {where}" + also
            )
        if self.holding:
            return (
                f"no progress for {STALL_SECONDS:g} s (wall): {', '.join(sorted(self.holding))} "
                f"waits out of band (its clock held) {where}"
            )
        first = self.bounding()
        report = self.reports[first]
        store = self.store.next_time()
        return (
            f"no progress for {STALL_SECONDS:g} s (wall): {first}'s next event at "
            f"t={report.next_time * 1e6:.3f} us holds the windows (until "
            f"{self.until * 1e6:.3f} us) {where}; received {report.received}, quiet {report.quiet}"
            + ("" if store is None else f"; the store's next operation at t={store * 1e6:.3f} us")
        )
