"""How a run runs: its clock and what goes with it, one value every layer above passes on.

A run's results do not depend on its clock, except on the wall clock (docs/architecture.md):

- ``virtual``: every node in one process, one event engine under trio's MockClock.
- ``exact``: node processes synchronised window by window on emulated time; the virtual run's
  figures, on any machine however loaded.
- ``wall``: node processes on the dilated wall clock (``tdf`` wall seconds per emulated
  second), for live interop with real tools.

:class:`RunOptions` is one frozen value; the command line makes it once
(:func:`rocev2_emu.cli.args.run_options`) and the jobs dispatch on its clock.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Clock(enum.StrEnum):
    """What time a run's nodes live on."""

    VIRTUAL = "virtual"
    EXACT = "exact"
    WALL = "wall"


@dataclass(frozen=True, slots=True)
class RunOptions:
    """A run's clock and its parameters.

    ``tdf``: the wall clock's dilation (None: the topology's).  ``workers``: processes hosting
    the nodes of an exact run (None: one per node).  ``pace``: at least that many wall seconds
    per emulated second of an exact run.  ``payload``: ``none`` for timing-only frames, ``real``
    (None: the topology's).  A field its clock does not take is refused here, once.
    """

    clock: Clock = Clock.EXACT
    tdf: float | None = None
    workers: int | None = None
    pace: float | None = None
    payload: str | None = None

    def __post_init__(self) -> None:
        if self.pace is not None and self.clock is not Clock.EXACT:
            raise ValueError("--pace slows an exact run to the wall clock: give --clock exact too")
        if self.workers is not None and self.clock is not Clock.EXACT:
            raise ValueError(
                "--workers groups the processes of an exact run: give --clock exact (or --virtual)"
            )
        if self.tdf is not None and self.tdf <= 0:
            raise ValueError(f"--tdf {self.tdf:g}: a dilation is a positive factor")

    def dilation(self, topology_tdf: float) -> float:
        """Wall seconds per emulated second of the node processes: the wall clock's TDF (the
        topology's unless given); 1 on the other clocks, whose nodes never read the wall."""
        if self.clock is Clock.WALL:
            return self.tdf or topology_tdf
        return 1.0
