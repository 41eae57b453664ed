"""A slow receiver: the NIC's receive buffer drained at the host's rate, with PFC at the edge.

Real RoCE NICs pause their switch port when the host cannot take frames as fast as the wire
brings them (PCIe or memory bandwidth, a busy host): the NIC's receive buffer fills past its
XOFF threshold and the NIC sends 802.1Qbb pause frames for the lossless priority, refreshed
while the buffer stays full, and a zero-quanta resume once it has drained below XON.  This is
how pauses start at the edge of a fabric rather than in its core.

Sans-IO: frames are queued with the time the host will have taken them in; the NIC processes
each when its time comes.  With ``rx_bps`` 0 (the default) the host keeps up with any link and
none of this is used.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from rocev2_emu.wire.linerate import WIRE_OVERHEAD
from rocev2_emu.wire.pfc import pause_time


@dataclass(slots=True)
class IngressConfig:
    rx_bps: float = 0.0  # the host's drain rate; 0: it keeps up with the link
    buffer_bytes: int = 256 * 1024
    xoff_bytes: int = 128 * 1024
    xon_bytes: int = 64 * 1024
    quanta: int = 0xFFFF
    priorities: frozenset[int] = field(default_factory=lambda: frozenset({3}))


class IngressQueue:
    def __init__(self, config: IngressConfig, link_bps: float) -> None:
        if not 0 < config.xon_bytes < config.xoff_bytes < config.buffer_bytes:
            raise ValueError(f"need 0 < xon < xoff < buffer, got {config}")
        self.config = config
        self.link_bps = link_bps
        self.frames: deque[tuple[float, bytes, int]] = deque()  # (ready time, datagram, size)
        self.bytes = 0
        self.busy_until = 0.0
        self.paused = False
        self.refresh_at = 0.0
        self.dropped = 0
        self.pfc_sent = 0

    def arrive(self, datagram: bytes, now: float, size: int = -1) -> bool:
        """Queue a datagram of ``size`` bytes (-1: its length; a timing-only run's elided frame
        is its whole length); False (a counted drop) when the buffer is full."""
        if size < 0:
            size = len(datagram)
        if self.bytes + size > self.config.buffer_bytes:
            self.dropped += 1
            return False
        self.busy_until = (
            max(self.busy_until, now) + (size + WIRE_OVERHEAD) * 8 / self.config.rx_bps
        )
        self.frames.append((self.busy_until, datagram, size))
        self.bytes += size
        return True

    def due(self, now: float) -> list[bytes]:
        out = []
        while self.frames and self.frames[0][0] <= now:
            _, datagram, size = self.frames.popleft()
            self.bytes -= size
            out.append(datagram)
        return out

    def pfc_decision(self, now: float) -> int | None:
        """Quanta to send now (XOFF, a refresh, or 0 for XON), or None."""
        c = self.config
        if not self.paused and self.bytes > c.xoff_bytes:
            self.paused = True
        elif self.paused and self.bytes < c.xon_bytes:
            self.paused = False
            self.refresh_at = 0.0
            self.pfc_sent += 1
            return 0
        elif not (self.paused and now >= self.refresh_at):
            return None
        self.refresh_at = now + pause_time(c.quanta, self.link_bps) / 2
        self.pfc_sent += 1
        return c.quanta

    def get_timer(self) -> float | None:
        times = []
        if self.frames:
            times.append(self.frames[0][0])
        if self.paused:
            times.append(self.refresh_at)
        return min(times) if times else None
