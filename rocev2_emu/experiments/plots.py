"""Plots of scenario runs (matplotlib, the ``plot`` extra): per-flow goodput, the watched
port's queue, PFC pauses shaded, and a model's queue where a scenario has one."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from rocev2_emu.experiments.runs import Run


def pyplot() -> Any | None:
    """matplotlib's pyplot on the Agg backend, or None when matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def save(plt: Any, fig: Any, path: Path) -> bool:
    """Lay ``fig`` out, write it to ``path`` and free it: the end of every scenario's plot."""
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


def plotted(
    draw: Callable[[Any, list[dict[str, Any]]], Any],
) -> Callable[[list[dict[str, Any]], Path], bool]:
    """A scenario's plot from ``draw(plt, rows)``, which makes and returns the figure: saved to
    the path, or False (nothing drawn) without matplotlib."""

    def plot(rows: list[dict[str, Any]], path: Path) -> bool:
        plt = pyplot()
        if plt is None:
            return False
        return save(plt, draw(plt, rows), path)

    plot.__doc__ = draw.__doc__
    return plot


MANY_FLOWS = 16  # beyond this a run's flows are drawn together, not one line (and label) each


def _plot_many(ax: Any, t: list[float], goodput: dict[int, list[float]]) -> None:
    """Many flows at once: their total, and the spread of one flow's goodput (min to max,
    the mean between)."""
    import numpy as np

    rates = np.array([goodput[f] for f in sorted(goodput)])  # flow x sample
    ax.plot(t, rates.sum(axis=0), color="tab:blue", label=f"all {len(rates)} flows, total")
    ax.fill_between(
        t,
        rates.min(axis=0),
        rates.max(axis=0),
        color="tab:orange",
        alpha=0.3,
        linewidth=0,
        label="one flow: min to max",
    )
    ax.plot(t, rates.mean(axis=0), color="tab:orange", label="one flow: mean")


def plot_runs(name: str, runs: list[Run], path: Path) -> bool:
    plt = pyplot()
    if plt is None:
        return False
    fig, axes = plt.subplots(len(runs), 1, figsize=(9, 3.2 * len(runs)), squeeze=False)
    for ax, run in zip(axes[:, 0], runs, strict=True):
        t = [x * 1e6 for x in run.times]
        if len(run.goodput) <= MANY_FLOWS:
            ends = {r.id: f"{r.src} \u2192 {r.dst}" for r in run.results}  # which flow is which
            for flow, series in sorted(run.goodput.items()):
                ax.plot(t, series, label=ends.get(flow, f"flow {flow}"))
        elif run.goodput:
            _plot_many(ax, t, run.goodput)
        ax.set_ylabel("goodput (Gbit/s)")
        ax.set_title(f"{name}: {run.setting}")
        q = ax.twinx()
        q.plot(t, [b / 1024 for b in run.queue], color="black", linestyle=":", label="queue")
        q.set_ylabel("bottleneck queue (KiB)")
        if run.queue_reference is not None:
            q.axhline(run.queue_reference / 1024, color="grey", linestyle="--", linewidth=1)
        for i, paused in enumerate(run.paused):
            if paused and i + 1 < len(t):
                ax.axvspan(t[i], t[i + 1], color="red", alpha=0.08, linewidth=0)
        if run.goodput:  # one legend for both axes: the flows and the queue
            lines, labels = ax.get_legend_handles_labels()
            more, more_labels = q.get_legend_handles_labels()
            ax.legend(lines + more, labels + more_labels, loc="upper right", fontsize=7)
    axes[-1, 0].set_xlabel(
        "time (emulated us); shaded: PFC pause in force; dashed: the fluid model's queue"
        if any(r.queue_reference is not None for r in runs)
        else "time (emulated us); shaded: PFC pause in force"
    )
    return save(plt, fig, path)
