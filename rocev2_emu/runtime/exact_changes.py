"""The changes to the fabric one process of an exact run asks for and is handed, sans-IO.

A change (:class:`~rocev2_emu.runtime.sync_messages.LinkChange`: links down, up, or new
faults) is asked for here - by a job's rank at an instant, or from outside the run without one -
and goes to the coordinator with the next report (:meth:`RunChanges.take_asked`).  The
coordinator hands every change to every process with a window (:meth:`RunChanges.hand_out`),
and each applies it when its engine reaches the instant, before that instant's frames
(:meth:`RunChanges.apply`).  It grows with the changes asked for and not yet applied.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable

import trio

from rocev2_emu.runtime.sync_messages import LinkChange, SyncError


class ChangeWaiter:
    """Where the instant the coordinator gave a change asked for without one lands."""

    __slots__ = ("at", "change", "event")

    def __init__(self, change: LinkChange) -> None:
        self.change = change
        self.event = trio.Event()
        self.at: float | None = None


class RunChanges:
    """One process's changes to the fabric (see the module); ``on_change(change, now)`` is what
    a change does here (the node process sets it: a switch's ports and routes)."""

    def __init__(self) -> None:
        self.on_change: Callable[[LinkChange, float], None] | None = None
        self._out: list[LinkChange] = []  # asked for since the last report
        self._due: list[tuple[float, int, LinkChange]] = []  # handed out, a heap by time
        self._seen = 0
        self._asked: list[ChangeWaiter] = []  # asked for without an instant, not yet given one

    def ask(self, change: LinkChange) -> ChangeWaiter:
        """Ask for ``change`` (sent with the next report); its waiter has the instant at once,
        or once the coordinator gives it one."""
        self._out.append(change)
        waiter = ChangeWaiter(change)
        if change.at is None:
            self._asked.append(waiter)
        else:
            waiter.at = change.at
            waiter.event.set()
        return waiter

    def take_asked(self) -> list[LinkChange]:
        """The changes asked for since the last report, for the report."""
        out, self._out = self._out, []
        return out

    def hand_out(self, changes: list[LinkChange], name: str) -> None:
        """The changes a grant to process ``name`` carries, each with its instant."""
        for change in changes:
            if change.at is None:
                raise SyncError(f"{name}: a link change came without its instant")
            for waiter in self._asked:  # the first ask of this change: its instant
                if waiter.change.at_instant(0.0) == change.at_instant(0.0):
                    waiter.at = change.at
                    waiter.event.set()
                    self._asked.remove(waiter)
                    break
            self._seen += 1
            heapq.heappush(self._due, (change.at, self._seen, change))

    @property
    def pending(self) -> bool:
        """Changes asked for and not yet reported, or handed out and not yet applied."""
        return bool(self._due or self._out)

    def next_time(self) -> float:
        """The instant of the next change to apply (inf: none)."""
        return self._due[0][0] if self._due else math.inf

    def apply(self, now: float) -> None:
        """The changes due by ``now``, in the order they were asked for at one instant."""
        due = self._due
        while due and due[0][0] <= now:
            _, _, change = heapq.heappop(due)
            if self.on_change is not None:
                self.on_change(change, now)
