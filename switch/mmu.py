"""The switch's memory management unit: one shared buffer, per-(ingress port, priority)
accounting, a reserve and PFC headroom per port, and the thresholds that drive PFC.

Modelled on the ns-3 HPCC simulator's ``switch-mmu.cc`` (itself after Broadcom's MMU):

* Every (ingress port, priority) has a guaranteed ``reserve``; bytes beyond it come from the
  shared pool.  ``shared_used(port, prio) = max(0, ingress_bytes - reserve)``.
* Lossless priorities: XOFF when a counter's shared use reaches the PFC threshold - static
  (``xoff_bytes``) or dynamic, ``alpha x free shared buffer`` - and XON when it falls
  ``xon_offset`` below it (hysteresis).  Bytes that arrive after XOFF land in the port's
  ``headroom``; a lossless packet is dropped only when both the shared pool and the headroom are
  exhausted (then it is counted: it means the headroom was sized too small).
* Lossy priorities tail-drop when their shared use would exceed ``alpha x free`` (the classic
  dynamic threshold) or the pool is full.
* ``mode = "static"``: no sharing between ports.  The pool is cut into one equal partition per
  ingress port (a deep-buffer spine's static split, as Meta describes its spines); a port's
  priorities draw only from its partition, a lossless one XOFFs when the partition is full
  (or at ``xoff_bytes``) and a lossy one tail-drops there.  The buffer may be gigabytes: this
  is accounting, nothing is allocated.

Counts are bytes of Ethernet frames.  No I/O, no clock: the pipeline calls in and acts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from rocev2_emu.wire.qos import PRIORITIES

BUFFER_MODES: Final = ("shared", "static")
# what admit_enqueue did with a frame (named Final ints: mypyc compiles them to constants)
ADMIT_DROP: Final = -1  # no room: the caller drops it
ADMIT_SHARED: Final = 0  # taken into the reserve or the shared pool
ADMIT_HEADROOM: Final = 1  # lossless traffic after XOFF: taken into the PFC headroom
FRAME_ALLOWANCE: Final = 128  # bytes a frame takes beyond the path MTU (headers, trailer, gap)


def pfc_headroom(rate_bps: float, delay: float, mtu: int) -> int:
    """The bytes a lossless port must take after its XOFF (802.1Qbb's headroom, sized as switch
    vendors size it from the cable): what the upstream sends while the pause crosses the link
    and its last frames cross back - twice the one-way bandwidth-delay product - and three
    frames: the one whose arrival crossed the threshold, the one the pause waits behind here,
    the one the upstream has begun.  0 for an unpaced link."""
    if rate_bps <= 0:
        return 0
    return int(2 * rate_bps / 8 * delay + 0.999999) + 3 * (mtu + FRAME_ALLOWANCE)


@dataclass(slots=True)
class MmuConfig:
    buffer_bytes: int = 12 * 2**20
    reserve_bytes: int = 4 * 1024  # per (ingress port, priority)
    headroom_bytes: int = 96 * 1024  # per port, for lossless traffic in flight after XOFF
    alpha: float = 1 / 8  # dynamic threshold factor (HPCC: pfc_a_shift 3)
    xoff_bytes: int = 0  # > 0: static XOFF threshold instead of the dynamic one
    xon_offset_bytes: int = 2 * 4200  # hysteresis: XON this far below the threshold
    mode: str = "shared"  # or "static": one fixed partition of the pool per ingress port


class Mmu:
    def __init__(
        self,
        config: MmuConfig,
        ports: int,
        lossless: frozenset[int],
        headrooms: list[int] | None = None,
    ) -> None:
        """``headrooms``: each port's PFC headroom as its link needs it (:func:`pfc_headroom`);
        a port takes that or the config's ``headroom_bytes``, whichever is more."""
        floor = config.headroom_bytes
        self.port_headroom = [max(floor, h) for h in headrooms or [floor] * ports]
        if len(self.port_headroom) != ports:
            raise ValueError(f"{len(self.port_headroom)} headrooms for {ports} ports")
        if (
            config.buffer_bytes
            <= sum(self.port_headroom) + ports * PRIORITIES * config.reserve_bytes
        ):
            raise ValueError(
                f"buffer of {config.buffer_bytes} bytes cannot hold the reserve and headroom of "
                f"{ports} ports"
            )
        if config.mode not in BUFFER_MODES:
            raise ValueError(f"buffer mode {config.mode!r}: one of {BUFFER_MODES}")
        self.config = config
        self.lossless = lossless
        self.lossless_mask = 0  # the same priorities as bits (a frozenset's look-up boxes)
        for prio in lossless:
            self.lossless_mask |= 1 << prio
        self.ingress = [[0] * PRIORITIES for _ in range(ports)]
        self.headroom_used = [[0] * PRIORITIES for _ in range(ports)]
        self.shared_total = 0
        self.total = 0
        self.paused = [[False] * PRIORITIES for _ in range(ports)]  # XOFF in force upstream
        reserved = sum(self.port_headroom) + ports * PRIORITIES * config.reserve_bytes
        self.shared_size = config.buffer_bytes - reserved
        self.static = config.mode == "static"
        self.partition = self.shared_size // ports if ports else 0  # static: each port's share
        self.port_shared = [0] * ports  # shared bytes per ingress port (all priorities)

    def shared_used(self, port: int, prio: int) -> int:
        used = self.ingress[port][prio] - self.config.reserve_bytes
        return used if used > 0 else 0

    def pfc_threshold(self) -> float:
        c = self.config
        if c.xoff_bytes:
            return c.xoff_bytes
        if self.static:
            return self.partition
        free = self.shared_size - self.shared_total
        return c.alpha * free if free > 0 else 0.0

    def admit_enqueue(self, port: int, prio: int, size: int) -> int:
        """Account a frame of ``size`` bytes from ``port`` at ``prio``: ADMIT_DROP when there is
        no room (the caller drops it), ADMIT_SHARED when it went to the reserve or the shared
        pool, ADMIT_HEADROOM when it went to the PFC headroom (lossless traffic after XOFF)."""
        c = self.config
        reserve = c.reserve_bytes
        row = self.ingress[port]
        ing = row[prio]
        after = ing + size
        if after <= reserve:
            row[prio] = after
            self.total += size
            return ADMIT_SHARED
        used = ing - reserve if ing > reserve else 0
        grow = after - reserve - used
        full = self.static and self.port_shared[port] + grow > self.partition
        if self.lossless_mask >> prio & 1:
            if self.paused[port][prio] or used + grow > self.pfc_threshold() or full:
                headroom = self.headroom_used[port]
                if headroom[prio] + size > self.port_headroom[port]:
                    return ADMIT_DROP
                headroom[prio] = headroom[prio] + size  # (not +=: mypyc adds it as an object)
                self.total += size
                return ADMIT_HEADROOM
            if self.shared_total + grow > self.shared_size:
                return ADMIT_DROP
        elif self.static:
            if full:
                return ADMIT_DROP
        else:
            free = self.shared_size - self.shared_total
            if grow > free or used + grow > c.alpha * free:
                return ADMIT_DROP
        row[prio] = after
        self.shared_total += grow
        port_shared = self.port_shared
        port_shared[port] = port_shared[port] + grow
        self.total += size
        return ADMIT_SHARED

    def dequeue(self, port: int, prio: int, size: int, from_headroom: bool) -> None:
        self.total -= size
        if from_headroom:  # (no -= on list items: mypyc subtracts them as objects)
            headroom = self.headroom_used[port]
            headroom[prio] = headroom[prio] - size
            return
        reserve = self.config.reserve_bytes
        row = self.ingress[port]
        ing = row[prio]
        row[prio] = ing - size
        before = ing - reserve
        after = before - size
        freed = (before if before > 0 else 0) - (after if after > 0 else 0)
        self.shared_total -= freed
        port_shared = self.port_shared
        port_shared[port] = port_shared[port] - freed

    def should_pause(self, port: int, prio: int) -> bool:
        return (
            self.lossless_mask >> prio & 1 == 1
            and not self.paused[port][prio]
            and (
                self.headroom_used[port][prio] > 0
                or self.shared_used(port, prio) >= self.pfc_threshold()
            )
        )

    def should_resume(self, port: int, prio: int) -> bool:
        if not self.paused[port][prio] or self.headroom_used[port][prio]:
            return False
        resume_at = self.pfc_threshold() - self.config.xon_offset_bytes
        return self.shared_used(port, prio) <= (resume_at if resume_at > 0 else 0.0)
