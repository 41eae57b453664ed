"""What the collective scenarios share: the fields every job row carries about its fabric,
and the grouped bar chart of a value per workload and setting."""

from __future__ import annotations

from typing import Any

from collectives.comm.communicator import tally


def value_check(
    rows: list[dict[str, Any]], text: str = "every value right"
) -> list[tuple[str, bool]]:
    """The check that every value arrived right over ``rows`` (each with its ``wrong``); none
    when a run was timing-only (``wrong`` None: the fabric carried no values to check)."""
    if any(r["wrong"] is None for r in rows):
        return []
    return [(text, all(r["wrong"] == 0 for r in rows))]


def shown(wrong: int | None) -> str:
    """A count of wrong values as a report line gives it."""
    return "N/A (timing only)" if wrong is None else str(wrong)


def job_fields(results: dict[int, Any], fab: dict[str, Any]) -> dict[str, Any]:
    """The fields of a scenario's row that every one reports: values wrong over all ranks,
    pause frames, and (with processes) late wake-ups."""
    return {
        "wrong": tally(v["wrong"] for v in results.values()),
        "pfc_tx": fab["pfc_tx"],
        "late_wakeups": fab.get("late_wakeups", 0),
    }


def grouped_bars(
    ax: Any,
    rows: list[dict[str, Any]],
    key: str,
    label: str,
    settings: list[str],
    scale: float = 1.0,
) -> None:
    """On ``ax``: ``key`` (times ``scale``) of every row, a group of bars per setting, a bar
    per workload in each group, labelled ``label``."""
    workloads = list(dict.fromkeys(r["workload"] for r in rows))
    for k, workload in enumerate(workloads):
        values = [r[key] * scale for r in rows if r["workload"] == workload]
        ax.bar([i + 0.4 * k for i in range(len(values))], values, width=0.4, label=workload)
    ax.set_xticks([i + 0.2 for i in range(len(settings))], settings, rotation=20, fontsize=7)
    ax.set_ylabel(label)
    ax.legend(fontsize=8)
