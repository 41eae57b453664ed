"""Transport timer values from the IBTA specification.

Local ACK timeout (IBTA §9.7.6.1.3, C9-141): 4.096 µs × 2^timeout, 0 meaning infinite.
RNR NAK timer (§9.7.5.2.8, table 45): the responder's min_rnr_timer code, 0..31, in the AETH.
"""

from __future__ import annotations

from typing import Final

ACK_TIMEOUT_UNIT: Final = 4.096e-6

# Table 45: RNR NAK timer field encodings, in milliseconds; code 0 is the longest (655.36 ms).
RNR_TIMER_MS: Final[tuple[float, ...]] = (  # not a fixed-size native tuple: mypyc left that unset
    655.36,
    0.01,
    0.02,
    0.03,
    0.04,
    0.06,
    0.08,
    0.12,
    0.16,
    0.24,
    0.32,
    0.48,
    0.64,
    0.96,
    1.28,
    1.92,
    2.56,
    3.84,
    5.12,
    7.68,
    10.24,
    15.36,
    20.48,
    30.72,
    40.96,
    61.44,
    81.92,
    122.88,
    163.84,
    245.76,
    327.68,
    491.52,
)

RNR_RETRY_INFINITE: Final = 7


def local_ack_timeout(code: int) -> float | None:
    """Seconds the requester waits for an ACK before retrying; None when disabled (code 0)."""
    if code == 0:
        return None
    return ACK_TIMEOUT_UNIT * (1 << code)


def rnr_delay(code: int) -> float:
    return RNR_TIMER_MS[code & 0x1F] / 1000.0
