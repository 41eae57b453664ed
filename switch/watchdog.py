"""PFC watchdog with SONiC ``pfcwd`` semantics, per (egress port, priority) queue.

A queue that stays paused by its neighbour continuously for the detection time is declared
*stormed* (a PFC storm: a stuck NIC or a deadlock is pausing it forever).  With the default
action ``drop`` the switch then flushes the queue, drops what arrives for it and stops
honouring pauses for it; with ``forward`` it only stops honouring pauses.  The queue is restored
once no pause frame has been seen for the restoration time.  Times are emulated seconds.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from switch.mmu import PRIORITIES


class Watchdog:
    def __init__(self, ports: int, detect: float, restore: float) -> None:
        self.detect = detect
        self.restore = restore
        self.paused_since = [[-1.0] * PRIORITIES for _ in range(ports)]
        self.last_pause = [[-math.inf] * PRIORITIES for _ in range(ports)]
        self.stormed = [[False] * PRIORITIES for _ in range(ports)]
        self.storms_detected = [[0] * PRIORITIES for _ in range(ports)]
        self.storms_restored = [[0] * PRIORITIES for _ in range(ports)]

    def pause_seen(self, port: int, prio: int, now: float, xoff: bool, was_paused: bool) -> None:
        if xoff:
            self.last_pause[port][prio] = now
            if not was_paused or self.paused_since[port][prio] < 0:
                self.paused_since[port][prio] = now
        else:
            self.paused_since[port][prio] = -1.0

    def check(self, now: float, paused: Callable[[int, int, float], bool]) -> list[tuple[int, int]]:
        """Queues whose storm state changed at ``now``."""
        changed = []
        for port, row in enumerate(self.stormed):
            for prio in range(PRIORITIES):
                if row[prio]:
                    if now - self.last_pause[port][prio] >= self.restore:
                        row[prio] = False
                        self.paused_since[port][prio] = -1.0
                        self.storms_restored[port][prio] += 1
                        changed.append((port, prio))
                    continue
                since = self.paused_since[port][prio]
                if since < 0:
                    continue
                if not paused(port, prio, now):
                    self.paused_since[port][prio] = -1.0  # the pause lapsed
                elif now - since >= self.detect:
                    row[prio] = True
                    self.storms_detected[port][prio] += 1
                    changed.append((port, prio))
        return changed

    def get_timer(self) -> float | None:
        times = []
        for port, row in enumerate(self.stormed):
            for prio in range(PRIORITIES):
                if row[prio]:
                    times.append(self.last_pause[port][prio] + self.restore)
                elif self.paused_since[port][prio] >= 0:
                    times.append(self.paused_since[port][prio] + self.detect)
        return min(times) if times else None
