"""A scenario's run: one fabric run's flow results, its sampled time series and counters."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from rocev2_emu.fabric.agent import FlowResult


@dataclass(slots=True)
class Run:
    """One fabric run: flow results, time series and the fabric's counters."""

    setting: str
    results: list[FlowResult]
    times: list[float] = field(default_factory=list)  # emulated seconds
    goodput: dict[int, list[float]] = field(default_factory=dict)  # flow -> Gbit/s per sample
    queue: list[int] = field(default_factory=list)  # bottleneck egress queue, bytes
    paused: list[bool] = field(default_factory=list)  # any upstream pause in force
    marked: list[int] = field(default_factory=list)  # CE marks at the bottleneck, cumulative
    sent: list[int] = field(default_factory=list)  # packets out of the bottleneck, cumulative
    queue_reference: float | None = None  # a model's queue (bytes), drawn across the plot
    fabric: dict[str, Any] = field(default_factory=dict)


def runs_json(runs: list[Run]) -> list[dict[str, Any]]:
    return [{**asdict(r), "results": [asdict(x) for x in r.results]} for r in runs]
