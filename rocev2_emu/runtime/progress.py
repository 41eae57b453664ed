"""The progress line of a long virtual-time run, on a terminal only.

``\\r``-rewritten on stderr about twice a second: the emulated time reached, the frame-hops
per second of wall time, and the time left when the run knows how far along it is (a
``fraction`` callback: a flow job's delivered bytes over its total).  When stderr is not a
terminal (CI, a pipe, a file) there is no line at all and the engine pays nothing for it.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Final, Protocol, TextIO

EVERY_WALL_SECONDS: Final = 0.5
CHECK_EVERY: Final = 256  # engine instants between two looks at the wall clock


class Progressing(Protocol):
    @property
    def now(self) -> float: ...  # emulated seconds

    @property
    def hops(self) -> int: ...


class ProgressLine:
    def __init__(self, stream: TextIO, fraction: Callable[[], float] | None = None) -> None:
        self.stream = stream
        self.fraction = fraction
        self.start = time.monotonic()  # wall seconds (monotonic) when the run began
        self._next = self.start + EVERY_WALL_SECONDS
        self._calls = 0
        self._width = 0

    @classmethod
    def on_terminal(
        cls, fraction: Callable[[], float] | None = None, stream: TextIO | None = None
    ) -> ProgressLine | None:
        """A progress line on ``stream`` (default stderr) if it is a terminal, else None."""
        stream = stream or sys.stderr
        return cls(stream, fraction) if stream.isatty() else None

    def __call__(self, engine: Progressing) -> None:
        self._calls += 1
        if self._calls % CHECK_EVERY:
            return
        now = time.monotonic()
        if now < self._next:
            return
        self._next = now + EVERY_WALL_SECONDS
        self.show(engine, now)

    def show(self, engine: Progressing, wall: float) -> None:
        elapsed = max(wall - self.start, 1e-9)
        line = (
            f"virtual time {engine.now * 1e6:,.1f} us emulated, "
            f"{engine.hops / elapsed:,.0f} frame-hops/s, {elapsed:.0f} s"
        )
        if self.fraction is not None:
            done = self.fraction()
            if 0 < done < 1:
                line += f", {done:.0%} done, ETA {elapsed * (1 - done) / done:.0f} s"
        self.stream.write("\r" + line.ljust(self._width))
        self.stream.flush()
        self._width = len(line)

    def close(self) -> None:
        """Clear the line (the run's own output follows)."""
        if self._width:
            self.stream.write("\r" + " " * self._width + "\r")
            self.stream.flush()
            self._width = 0
