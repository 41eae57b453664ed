"""Summary statistics of measured values, one definition for every report.

:func:`percentile` is the nearest-rank percentile (the smallest value with at least ``q`` of
the values at or below it), what perftest and nccl-tests print as p99; no interpolation, so a
reported p99 is always a value that was measured.
"""

from __future__ import annotations

import math
from collections.abc import Sequence


def percentile(values: Sequence[float], q: float) -> float:
    """The nearest-rank ``q`` quantile (0 < q <= 1) of ``values``; 0.0 when there are none."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]
