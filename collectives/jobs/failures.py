"""What failed in a job, said once per reason: the ranks of a job that fail for one reason (a
ring too long for the schedule, a dead peer) are named as ranges beside it, so a job of a
thousand ranks that fails one way prints one line, not a thousand."""

from __future__ import annotations

from typing import Any


def rank_ranges(ranks: list[int]) -> str:
    """``[0, 1, 2, 5, 7, 8]`` as ``0-2, 5, 7-8``."""
    out: list[str] = []
    ordered = sorted(ranks)
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        out.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ", ".join(out)


def failures(bad: dict[int, Any]) -> list[str]:
    """One line per reason among the failed ranks ``bad`` (rank: its result, an ``{"error":
    ...}`` or whatever it returned instead), the ranks first: ``ranks 0-1023: ValueError: ...``.
    Grows with the distinct reasons, not with the ranks."""
    by_reason: dict[str, list[int]] = {}
    for rank, value in bad.items():
        why = value.get("error") if isinstance(value, dict) and "error" in value else value
        by_reason.setdefault(str(why), []).append(rank)
    lines = []
    for why, ranks in by_reason.items():
        who = f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {rank_ranges(ranks)}"
        lines.append(f"{who}: {why}")
    return lines
