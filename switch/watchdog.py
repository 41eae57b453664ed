"""PFC watchdog with SONiC ``pfcwd`` semantics, per (egress port, priority) queue.

A queue that stays paused by its neighbour continuously for the detection time is declared
*stormed* (a PFC storm: a stuck NIC or a deadlock is pausing it forever).  With the default
action ``drop`` the switch then flushes the queue, drops what arrives for it and stops
honouring pauses for it; with ``forward`` it only stops honouring pauses.  The queue is restored
once no pause frame has been seen for the restoration time.  Times are emulated seconds.

Only the queues being watched (paused, or stormed) cost anything on a timer: the set of them is
kept as pauses come and go, so a switch with many ports pays nothing for its idle ones.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from rocev2_emu.wire.qos import PRIORITIES


class Watchdog:
    def __init__(self, ports: int, detect: float, restore: float) -> None:
        self.detect = detect
        self.restore = restore
        self.paused_since = [[-1.0] * PRIORITIES for _ in range(ports)]
        self.last_pause = [[-math.inf] * PRIORITIES for _ in range(ports)]
        self.stormed = [[False] * PRIORITIES for _ in range(ports)]
        self.storms_detected = [[0] * PRIORITIES for _ in range(ports)]
        self.storms_restored = [[0] * PRIORITIES for _ in range(ports)]
        self._watched: set[tuple[int, int]] = set()  # (port, prio): paused, or stormed

    @property
    def watching(self) -> bool:
        """Some queue is paused or stormed: :meth:`check` has something to look at."""
        return bool(self._watched)

    def pause_seen(self, port: int, prio: int, now: float, xoff: bool, was_paused: bool) -> None:
        if xoff:
            self.last_pause[port][prio] = now
            if not was_paused or self.paused_since[port][prio] < 0:
                self.paused_since[port][prio] = now
            self._watched.add((port, prio))
        else:
            self.paused_since[port][prio] = -1.0
            if not self.stormed[port][prio]:
                self._watched.discard((port, prio))

    def check(self, now: float, paused: Callable[[int, int, float], bool]) -> list[tuple[int, int]]:
        """Queues whose storm state changed at ``now``."""
        changed: list[tuple[int, int]] = []
        if not self._watched:
            return changed
        for port, prio in sorted(self._watched):
            row = self.stormed[port]
            if row[prio]:
                if now - self.last_pause[port][prio] >= self.restore:
                    row[prio] = False
                    self.paused_since[port][prio] = -1.0
                    self.storms_restored[port][prio] += 1
                    changed.append((port, prio))
                    self._watched.discard((port, prio))
                continue
            since = self.paused_since[port][prio]
            if since < 0:
                self._watched.discard((port, prio))
                continue
            if not paused(port, prio, now):
                self.paused_since[port][prio] = -1.0  # the pause lapsed
                self._watched.discard((port, prio))
            elif now - since >= self.detect:
                row[prio] = True
                self.storms_detected[port][prio] += 1
                changed.append((port, prio))
        return changed

    def get_timer(self) -> float | None:
        t: float | None = None
        for port, prio in self._watched:
            if self.stormed[port][prio]:
                at = self.last_pause[port][prio] + self.restore
            elif self.paused_since[port][prio] >= 0:
                at = self.paused_since[port][prio] + self.detect
            else:
                continue
            if t is None or at < t:
                t = at
        return t
