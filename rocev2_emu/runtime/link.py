"""Per-link fault injection and propagation delay (sans-IO), applied where a frame leaves.

Seeded and reproducible: a ``random.Random(seed)`` decides, frame by frame, whether it is lost,
duplicated, corrupted (one bit flipped inside the Ethernet frame, so the receiver's IPv4 checksum
or ICRC check catches it), held back so later frames overtake it (reordering), or delayed.  All
times are emulated seconds.  Every decision is counted.
"""

from __future__ import annotations

import heapq
import math
import random
from dataclasses import dataclass
from typing import Any, Final

from rocev2_emu.wire.ethernet import VXLAN_LEN

_PROBABILITIES: Final = ("loss", "duplicate", "reorder", "corrupt")
_AMOUNTS: Final = (*_PROBABILITIES, "delay", "jitter", "reorder_hold")  # the fields but the seed


@dataclass(slots=True)
class LinkFaults:
    """What can go wrong on a link; probabilities per frame, delays in emulated seconds."""

    loss: float = 0.0
    duplicate: float = 0.0
    reorder: float = 0.0
    corrupt: float = 0.0
    delay: float = 0.0  # propagation + extra delay for every frame
    jitter: float = 0.0  # uniform extra delay in [0, jitter)
    reorder_hold: float = 5e-6  # how long a reordered frame is held back
    seed: int = 0

    def __post_init__(self) -> None:
        for name in _AMOUNTS:  # not dataclasses.fields(): a tuple of Field objects per link
            value = getattr(self, name)
            if (
                isinstance(value, bool)
                or not isinstance(value, (int, float))
                or not 0 <= value < math.inf
            ):
                raise ValueError(f"link fault {name}={value!r} must be a finite number >= 0")
        for name in _PROBABILITIES:
            if getattr(self, name) > 1:
                raise ValueError(f"link fault {name}={getattr(self, name)} is not a probability")

    @property
    def delay_only(self) -> bool:
        """Every frame arrives, once, intact, in order, after the fixed delay."""
        return not (self.loss or self.duplicate or self.reorder or self.corrupt or self.jitter)

    @property
    def active(self) -> bool:
        return bool(self.delay) or not self.delay_only


def faults_from_request(settings: Any) -> LinkFaults:
    """A link's faults as a control request gives them: a map of the fields, each a number -
    a boolean is refused (``loss=True`` is no probability, nor ``delay=False`` a delay; the
    dataclass alone would take them as 1 and 0) - then checked as :class:`LinkFaults` checks."""
    if not isinstance(settings, dict):
        raise ValueError(f"link faults must be a map, not {type(settings).__name__}")
    for name, value in settings.items():
        if name not in _AMOUNTS and name != "seed":
            raise ValueError(f"link fault {name!r}: no such setting (one of {', '.join(_AMOUNTS)})")
        if isinstance(value, bool):
            raise ValueError(f"link fault {name}={value!r} must be a number, not a boolean")
        if not isinstance(value, int if name == "seed" else int | float):
            # checked here, not by the dataclass: the compiled build's own TypeError names no field
            raise ValueError(f"link fault {name}={value!r} must be a number")
    return LinkFaults(**settings)


class FaultyLink:
    """Decides the fate of each datagram sent into a link."""

    def __init__(self, faults: LinkFaults) -> None:
        self.faults = faults
        self._rng = random.Random(faults.seed)
        self._held: list[tuple[float, int, bytes]] = []
        self._seq = 0
        self.lost = self.duplicated = self.reordered = self.corrupted = 0

    def update(self, faults: LinkFaults) -> None:
        """New fault settings at run time; frames already held keep their release times."""
        self.faults = faults

    def fates(self, datagram: bytes | bytearray, now: float) -> list[tuple[float, bytes]]:
        """What becomes of one datagram sent at ``now``: (arrival time, datagram) for each copy
        that arrives (none when lost, two when duplicated, a flipped bit when corrupted)."""
        f = self.faults
        rng = self._rng
        if f.loss and rng.random() < f.loss:
            self.lost += 1
            return []
        copies = 1
        if f.duplicate and rng.random() < f.duplicate:
            self.duplicated += 1
            copies = 2
        if f.corrupt and rng.random() < f.corrupt:
            self.corrupted += 1
            datagram = bytearray(datagram)
            bit = rng.randrange((len(datagram) - VXLAN_LEN) * 8)
            datagram[VXLAN_LEN + bit // 8] ^= 1 << (bit % 8)
        out: list[tuple[float, bytes]] = []
        data = bytes(datagram)
        for _ in range(copies):
            delay = f.delay + (rng.random() * f.jitter if f.jitter else 0.0)
            if f.reorder and rng.random() < f.reorder:
                self.reordered += 1
                delay += f.reorder_hold
            out.append((now + delay, data))
        return out

    def submit(self, datagram: bytes | bytearray, now: float) -> list[bytes | bytearray]:
        """Datagrams to send right away; the rest are held until :meth:`due`."""
        out: list[bytes | bytearray] = []
        for at, data in self.fates(datagram, now):
            if at > now:
                self._seq += 1
                heapq.heappush(self._held, (at, self._seq, data))
            else:
                out.append(data)
        return out

    def due(self, now: float) -> list[bytes]:
        out = []
        while self._held and self._held[0][0] <= now:
            out.append(heapq.heappop(self._held)[2])
        return out

    def get_timer(self) -> float | None:
        return self._held[0][0] if self._held else None
