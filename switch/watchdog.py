"""PFC watchdog with SONiC ``pfcwd`` semantics, per (egress port, priority) queue.

A queue that stays paused by its neighbour continuously for the detection time is declared
*stormed* (a PFC storm: a stuck NIC or a deadlock is pausing it forever).  With the default
action ``drop`` the switch then flushes the queue, drops what arrives for it and stops
honouring pauses for it; with ``forward`` it only stops honouring pauses.  The queue is restored
once no pause frame has been seen for the restoration time.  Times are emulated seconds.

Only the queues being watched (paused, or stormed) cost anything on a timer: the set of them is
kept as pauses come and go, so a switch with many ports pays nothing for its idle ones.  A
queue is watched as one integer, ``port * PRIORITIES + prio``, so that (port, priority) order is
the integers' order.
"""

from __future__ import annotations

import math

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
        self._watched: set[int] = set()  # port * PRIORITIES + prio: paused, or stormed

    @property
    def watching(self) -> bool:
        """Some queue is paused or stormed: :meth:`check` has something to look at."""
        return bool(self._watched)

    def pause_seen(self, port: int, prio: int, now: float, xoff: bool, was_paused: bool) -> None:
        if xoff:
            self.last_pause[port][prio] = now
            if not was_paused or self.paused_since[port][prio] < 0:
                self.paused_since[port][prio] = now
            self._watched.add(port * PRIORITIES + prio)
        else:
            self.paused_since[port][prio] = -1.0
            if not self.stormed[port][prio]:
                self._watched.discard(port * PRIORITIES + prio)

    def check(self, now: float, paused_until: list[list[float]]) -> list[tuple[int, int]]:
        """Queues whose storm state changed at ``now``, in (port, priority) order;
        ``paused_until[port][prio]``: until when the neighbour pauses that egress queue."""
        changed: list[tuple[int, int]] = []
        watched = self._watched
        if not watched:
            return changed
        for key in sorted(watched):
            port, prio = key // PRIORITIES, key % PRIORITIES
            row = self.stormed[port]
            if row[prio]:
                if now - self.last_pause[port][prio] >= self.restore:
                    row[prio] = False
                    self.paused_since[port][prio] = -1.0
                    self.storms_restored[port][prio] += 1
                    changed.append((port, prio))
                    watched.discard(key)
                continue
            since = self.paused_since[port][prio]
            if since < 0:
                watched.discard(key)
                continue
            if not paused_until[port][prio] > now:
                self.paused_since[port][prio] = -1.0  # the pause lapsed
                watched.discard(key)
            elif now - since >= self.detect:
                row[prio] = True
                self.storms_detected[port][prio] += 1
                changed.append((port, prio))
        return changed

    def get_timer(self) -> float | None:
        t: float | None = None
        if not self._watched:  # (most looks: an empty set's iterator is not free)
            return t
        for key in self._watched:
            port, prio = key // PRIORITIES, key % PRIORITIES
            if self.stormed[port][prio]:
                at = self.last_pause[port][prio] + self.restore
            elif self.paused_since[port][prio] >= 0:
                at = self.paused_since[port][prio] + self.detect
            else:
                continue
            if t is None or at < t:
                t = at
        return t
