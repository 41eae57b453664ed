"""Time dilation: emulated seconds <-> the trio clock.

One emulated second lasts ``tdf`` real (trio-clock) seconds, so a 100 Gbit/s link at TDF 100
carries 1 Gbit/s of real datagrams and a 10 µs timer fires after 1 ms (the DieCast idea, NSDI
2008).  Rates and queue dynamics in bytes are preserved; everything users read is emulated.
Under ``trio.testing.MockClock`` the same code runs in virtual time (use TDF 1 there).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from typing import Any, Final, Protocol

import trio

log = logging.getLogger(__name__)

LATE_WALL_SECONDS: Final = 0.005  # a wake-up this late (real time) is counted as behind
# emulated seconds behind: the late wake-ups are also counted beyond each (additive, so a run's
# share is a difference of two readings, where a "worst since start" would not be)
BEHIND_MARKS: Final = (1e-6, 10e-6, 100e-6)


class DilatedClock:
    """Maps the trio clock to emulated time, starting at 0 when created."""

    def __init__(
        self, tdf: float = 1.0, origin: float | None = None, *, epoch: float | None = None
    ) -> None:
        """``origin``: the trio-clock time of emulated 0 (default: now).  ``epoch``: the same
        instant as a ``time.monotonic()`` reading, which every process on one kernel (and every
        container) shares - so all nodes of a fabric agree on emulated time."""
        if not tdf > 0 or not math.isfinite(tdf):
            raise ValueError(f"time-dilation factor {tdf!r} must be a positive number")
        self.tdf = tdf
        if epoch is not None:
            origin = trio.current_time() - (time.monotonic() - epoch)
        self.origin = trio.current_time() if origin is None else origin
        # the same origin on time.monotonic(), for threads (the metrics server) that cannot
        # read the trio clock; both tick at CLOCK_MONOTONIC's rate under the system clock
        self._monotonic_origin = time.monotonic() - (trio.current_time() - self.origin)
        # where threads read emulated time when it is not the wall clock's (an exact run's
        # engine time; None: derived from time.monotonic())
        self.threadsafe: Callable[[], float] | None = None

    def now(self) -> float:
        """Current emulated time in seconds."""
        return (trio.current_time() - self.origin) / self.tdf

    def now_threadsafe(self) -> float:
        """Emulated time, from any thread (the real clock's, or :attr:`threadsafe`'s)."""
        if self.threadsafe is not None:
            return self.threadsafe()
        return (time.monotonic() - self._monotonic_origin) / self.tdf

    def to_trio(self, emulated: float) -> float:
        """The trio-clock time at which emulated time ``emulated`` arrives."""
        return self.origin + emulated * self.tdf

    def wall_duration(self, emulated_seconds: float) -> float:
        return emulated_seconds * self.tdf


def beyond_key(mark: float) -> str:
    """The stats key of the late wake-ups beyond ``mark`` (``late_beyond_10us``, ...)."""
    return f"late_beyond_{mark * 1e6:.0f}us"


class Late(Protocol):
    """A driver's lateness as its stats report it: a pump's, or the engine's (never late)."""

    @property
    def late_wakeups(self) -> int: ...

    @property
    def late_seconds(self) -> float: ...

    @property
    def late_beyond(self) -> list[int]: ...


def lateness_stats(driver: Late) -> dict[str, Any]:
    """A node's stats entries for its driver's late wake-ups: the count, the emulated seconds
    behind in all, and how many came beyond each of :data:`BEHIND_MARKS`."""
    beyond = zip(BEHIND_MARKS, driver.late_beyond, strict=True)
    return {
        "late_wakeups": driver.late_wakeups,
        "late_seconds": driver.late_seconds,
        **{beyond_key(mark): n for mark, n in beyond},
    }


class LatenessMonitor:
    """Counts a driver's wake-ups that came too late for their deadline and warns once: from
    then on the emulation is no longer faithful and the TDF should go up."""

    def __init__(self, clock: DilatedClock, what: str) -> None:
        self.clock = clock
        self.what = what
        self.late_wakeups = 0
        self.late_seconds = 0.0  # emulated seconds behind, summed over the late wake-ups
        self.late_beyond = [0] * len(BEHIND_MARKS)  # of them, how many beyond each mark

    def woke(self, now: float, deadline: float | None) -> None:
        """A driver woke at ``now`` (emulated) for ``deadline``."""
        if deadline is None or (now - deadline) * self.clock.tdf <= LATE_WALL_SECONDS:
            return
        self.late_wakeups += 1
        behind = now - deadline
        self.late_seconds += behind
        for i, mark in enumerate(BEHIND_MARKS):
            if behind > mark:
                self.late_beyond[i] += 1
        if self.late_wakeups == 1:
            log.warning(
                "%s fell %.0f µs (emulated) behind schedule at TDF %g: the emulation "
                "is no longer faithful; raise the TDF",
                self.what,
                (now - deadline) * 1e6,
                self.clock.tdf,
            )
