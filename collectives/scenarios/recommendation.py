"""``rocev2-emu scenario recommendation --virtual``: a recommendation model's training steps
(:mod:`collectives.bench.dlrm`) on Meta's AI Zone, and what its wiring and the all-reduce's
schedule do to the interconnect tax.

The fabric: one AI zone (``rocev2-emu topology ai-zone --zones 1 --racks 2 --servers-per-rack 2
--accelerators 4``): 16 accelerators, each with its own 400 Gbit/s NIC, the four of a server
joined by NVLink, under two CTSWs with 12.5 % spare uplink.  Two wirings - a rack training
switch per rack (the accelerators of a rack's servers under one leaf) and rail-optimized
(``--rails``: accelerator i of every server under rail leaf i) - and two schedules of the dense
gradients' all-reduce, the flat ring and the hierarchical one (reduce within the server first,
then the leaf or rail).  Each setting runs ``--iterations`` steps (default 3) of: the
embeddings' all-to-all (128 samples x 2 tables x 64 floats to each peer), 100 us of modelled
compute, the gradients' all-to-all back, a 2 MiB all-reduce.

Per setting: the step time, and the interconnect tax (the share of the step that is not
compute) split between the all-to-alls and the all-reduce.  The checks: every value right, and
the hierarchical all-reduce takes less of the step than the ring on both wirings.  Rails
against racks is reported, not checked: which wins depends on the traffic's mix.
"""

from __future__ import annotations

import tomllib
from typing import Any

from collectives.bench import dlrm
from collectives.jobs.failures import failures
from collectives.jobs.launch import run_recorded
from collectives.scenarios.common import shown, value_check
from rocev2_emu.experiments import harness
from rocev2_emu.experiments.harness import check_lines
from rocev2_emu.experiments.plots import plotted
from rocev2_emu.topology.file import parse
from rocev2_emu.topology.generate import ai_zone

SETTINGS = (  # name, rails, the all-reduce's schedule
    ("rack leaves, ring", False, "ring"),
    ("rack leaves, hierarchical", False, "hierarchical"),
    ("rails, ring", True, "ring"),
    ("rails, hierarchical", True, "hierarchical"),
)


def recommendation(
    seed: int, mode: harness.Mode | None = None
) -> tuple[list[dict[str, Any]], list[str], bool]:
    steps = (mode.iterations if mode is not None else None) or 3
    rows: list[dict[str, Any]] = []
    lines: list[str] = []
    for setting, rails, algo in SETTINGS:
        data = tomllib.loads(ai_zone(1, 2, 2, 4, rails=rails))
        data["fabric"]["seed"] = seed
        topo = parse(data, "recommendation.toml")
        params = {"steps": steps, "algo": algo, "slot_bytes": 64 << 10, "timeout": 1.0}
        results, fab = run_recorded(topo, "dlrm", params, setting, mode)
        bad = {r: v for r, v in results.items() if not isinstance(v, list)}
        if bad:
            raise RuntimeError(f"recommendation {setting}: " + "; ".join(failures(bad)))
        got = dlrm.summary(results)
        rows.append({"setting": setting, "ranks": len(results), **got, "pfc_tx": fab["pfc_tx"]})
        lines.append(
            f"{setting:>26}: step {got['step'] * 1e6:.1f} us, tax {got['tax']:.0%} (all-to-all "
            f"{got['a2a_share']:.0%}, all-reduce {got['ar_share']:.0%}); all-to-all "
            f"{got['all_to_all'] * 1e6:.1f} us, all-reduce {got['all_reduce'] * 1e6:.1f} us a "
            f"step; PFC frames {fab['pfc_tx']}, ECN marks {fab['ecn_marked']}, wrong "
            f"{shown(got['wrong'])}"
        )
    by = {r["setting"]: r for r in rows}
    checks = value_check(rows)
    for wiring in ("rack leaves", "rails"):
        ring, hier = by[f"{wiring}, ring"], by[f"{wiring}, hierarchical"]
        checks.append(
            (
                f"{wiring}: the hierarchical all-reduce takes less of the step "
                f"({hier['ar_share']:.0%} against the ring's {ring['ar_share']:.0%})",
                hier["ar_share"] < ring["ar_share"],
            )
        )
    check, ok = check_lines(checks)
    return rows, lines + check, ok


@plotted
def plot(plt: Any, rows: list[dict[str, Any]]) -> Any:
    """Per setting, the step stacked: all-to-alls, all-reduce, compute (and what is left)."""
    fig, ax = plt.subplots(figsize=(8, 3.8))
    names = [r["setting"] for r in rows]
    bottom = [0.0] * len(rows)
    for key, label in (
        ("all_to_all", "all-to-all"),
        ("all_reduce", "all-reduce"),
        ("compute", "compute"),
    ):
        values = [r[key] * 1e6 for r in rows]
        ax.bar(names, values, bottom=bottom, label=label)
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    ax.plot(names, [r["step"] * 1e6 for r in rows], "k_", markersize=30, label="step (slowest)")
    ax.set_ylabel("emulated us per step")
    ax.tick_params(axis="x", labelsize=7)
    ranks = rows[0]["ranks"] if rows else 0
    ax.set_title(f"recommendation: {ranks} accelerators of an AI zone, the tax by phase")
    ax.set_ylim(0, 1.3 * max((r["step"] * 1e6 for r in rows), default=1.0))
    ax.legend(fontsize=8, loc="upper center", ncol=4)
    return fig


def register() -> None:
    """Add ``recommendation`` to ``rocev2-emu scenario`` (virtual time; ``--iterations``)."""
    takes = frozenset({"iterations"})

    def job(seed: int, _tdf: float | None, mode: harness.Mode) -> harness.Rows:
        return recommendation(seed, mode)  # virtual time only: no TDF

    harness.register(
        harness.job_scenario("recommendation", job, plot, takes=takes, virtual_only=True)
    )
