"""Line-rate timing of one Ethernet link: when each frame may start (sans-IO, emulated time).

A frame occupies the wire for its bytes plus :data:`WIRE_OVERHEAD` (preamble and SFD 8, FCS 4,
inter-frame gap 12; IEEE 802.3 clause 4) at the link's rate.  The NIC's egress and each switch
port compute every frame's departure from the previous one and never sleep per frame.  A pump
that wakes late may send up to ``catchup`` emulated seconds "in the past" to keep the average
rate; a frame later than that loses its slot and is counted in ``behind_schedule``.  A link
with rate 0 is unpaced.
"""

from __future__ import annotations

from typing import Final

WIRE_OVERHEAD: Final = 24  # bytes on the wire besides the frame: preamble + SFD, FCS, IFG
NOMINAL_BPS: Final = 100e9  # pause quanta and ECN thresholds assume this when a link is unpaced


def wire_seconds(size: int, rate_bps: float) -> float:
    """How long a frame of ``size`` bytes (no FCS) occupies a link of ``rate_bps``."""
    return (size + WIRE_OVERHEAD) * 8 / rate_bps


class LinePacer:
    """The transmitter of one link: when it is free, and whether a busy period is running."""

    __slots__ = ("behind_schedule", "catchup", "free_at", "idle", "rate_bps")

    def __init__(self, rate_bps: float, catchup: float = 0.0) -> None:
        self.rate_bps = rate_bps
        self.catchup = catchup
        self.free_at = 0.0  # emulated time at which the wire is free for the next frame
        self.idle = True  # nothing was sent since the queue last ran dry
        self.behind_schedule = 0

    def ready(self, now: float) -> bool:
        """Whether a frame may start at ``now``."""
        return not self.rate_bps or self.free_at <= now

    def depart(self, size: int, now: float) -> None:
        """A frame of ``size`` bytes starts now: a new busy period starts at ``now``, a running
        one at the end of the previous frame (or ``catchup`` before now, for a late pump)."""
        rate = self.rate_bps
        if not rate:
            return
        start = self.free_at
        if self.idle:
            start = now
        elif now - start > self.catchup:
            self.behind_schedule += 1  # a late pump: this frame lost its slot
            start = now - self.catchup
        self.idle = False
        self.free_at = start + (size + WIRE_OVERHEAD) * 8 / rate
