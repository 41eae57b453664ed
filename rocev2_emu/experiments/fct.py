"""``fct``: flow-completion-time slowdown under a published workload, as the DCQCN and HPCC
papers measure it - flows drawn from the web-search distribution (DCTCP, SIGCOMM 2010)
arriving as a Poisson process at 30 % and 50 % of the hosts' line rate, between random pairs;
each flow's FCT over its ideal one alone on the fabric (:mod:`rocev2_emu.fabric.slowdown`),
by flow size at p50, p95 and p99.

Settings: PFC alone (no ECN, no DCQCN), and DCQCN with each shipped profile, each with the
marking its source ran: ``paper`` and ``nvidia`` the DCQCN paper's (Kmin 5 KB, Kmax 200 KB,
Pmax 1 %), ``hpcc`` the HPCC simulator's at 100 Gbit/s (Kmin 400 KB, Kmax 1 600 KB, Pmax
20 %, ``simulation/run.py``).  Every setting and load runs the same flows for a seed, over
several seeds (``--iterations``, from ``--seed``), on the shipped leaf-spine or a
``--topology`` file.  The report gives each figure's mean over seeds and its range.  A check
claims an effect only where every seed shows it, comparing runs of the same flows.
"""

from __future__ import annotations

import statistics
import tomllib
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any, Final

from rocev2_emu.experiments.harness import (
    Check,
    Mode,
    Outcome,
    Scenario,
    check_lines,
    fabric_run,
    settings,
    topology_data,
)
from rocev2_emu.experiments.plots import plotted
from rocev2_emu.fabric import slowdown, workload
from rocev2_emu.stats import percentile
from rocev2_emu.topology.file import parse
from rocev2_emu.topology.generate import leaf_spine

SETTINGS: Final = ("pfc", "dcqcn-paper", "dcqcn-nvidia", "dcqcn-hpcc")
LOADS: Final = (0.3, 0.5)
FLOWS: Final = 200  # per run, on the default (8-host) leaf-spine
SEEDS: Final = 3  # runs of each setting and load
SHORT: Final = 100_000  # bytes: the flows whose tail the checks read
_MARKING: Final = {  # ECN marking by DCQCN profile, as its source ran it: KB, KB, probability
    "paper": (5, 200, 0.01),
    "nvidia": (5, 200, 0.01),
    "hpcc": (400, 1600, 0.2),
}


def setting_sections(setting: str) -> dict[str, dict[str, Any]]:
    """The [pfc], [ecn] and [dcqcn] sections of ``setting`` (one of :data:`SETTINGS`)."""
    if setting == "pfc":
        return settings(True, False, False)
    profile = setting.removeprefix("dcqcn-")
    sections = settings(True, True, True, profile)
    kmin, kmax, pmax = _MARKING[profile]
    sections["ecn"].update(kmin_kb=kmin, kmax_kb=kmax, pmax=pmax)
    return sections


def _short_p95(flows: list[dict[str, Any]]) -> float:
    """The p95 slowdown of the run's flows under :data:`SHORT` bytes (0 when none)."""
    values = sorted(f["slowdown"] for f in flows if f["size"] < SHORT)
    return percentile(values, 0.95) if values else 0.0


def run_one(
    base: dict[str, Any], setting: str, load: float, seed: int, count: int, cdf: str, mode: Mode
) -> dict[str, Any]:
    """One run: ``count`` flows of ``cdf`` at ``load`` under ``setting``; its summary row."""
    data = topology_data(base, seed, **setting_sections(setting))
    topo = parse(data, "<fct>")
    flows = list(workload.poisson_flows(topo, workload.load_cdf(cdf), load, count=count, seed=seed))
    label = setting if mode.processes else f"{setting}@{load:g}"
    run = fabric_run(data, flows, topo.hosts[0].name, 0.0, label, mode)
    sizes = {f.id: f.size for f in flows}
    per_flow = [{**f, "size": sizes[f["id"]]} for f in slowdown.slowdowns(topo, run.results)]
    return {
        "setting": setting,
        "load": load,
        "seed": seed,
        "flows": len(flows),
        "completed": sum(r.ok for r in run.results),
        "buckets": slowdown.summary(topo, run.results),
        "short_p95": _short_p95(per_flow),
        "pfc_tx": run.fabric.get("pfc_tx", 0),
        "ecn_marked": run.fabric.get("ecn_marked", 0),
        "cnps_sent": run.fabric.get("cnps_sent", 0),
    }


def _spread(values: list[float]) -> str:
    """The mean over seeds and, with more than one, its range."""
    mean = f"{statistics.fmean(values):6.2f}"
    return mean if len(values) == 1 else f"{mean} [{min(values):.2f}-{max(values):.2f}]"


def _table(rows: list[dict[str, Any]], load: float, setting: str) -> list[str]:
    """The mean and range over seeds of each bucket's percentiles, for one setting and load."""
    mine = [r for r in rows if r["load"] == load and r["setting"] == setting]
    lines = [
        f"{setting:>13} at {load:.0%}: short flows' p95 {_spread([r['short_p95'] for r in mine])}"
        f"; PFC frames {statistics.fmean(r['pfc_tx'] for r in mine):.0f}, CNPs "
        f"{statistics.fmean(r['cnps_sent'] for r in mine):.0f} a run"
    ]
    for low, _ in slowdown.BUCKETS:
        cells = [b for r in mine for b in r["buckets"] if b["bytes"][0] == low]
        if len(cells) < len(mine):  # a seed without flows of this size: no figure across seeds
            continue
        span = slowdown.span(*cells[0]["bytes"])
        flows = sum(b["flows"] for b in cells) / len(cells)
        lines.append(
            f"{'':>15}{span:>12} {flows:6.0f} flows  "
            + "  ".join(f"{q} {_spread([b[q] for b in cells])}" for q in ("p50", "p95", "p99"))
        )
    return lines


def below(rows: list[dict[str, Any]], low: tuple[str, float], high: tuple[str, float]) -> Check:
    """``low``'s short flows' p95 slowdown (setting, load) under ``high``'s on every seed: the
    same flows for a seed (arrivals scaled by the load), so the pair shows the effect, not the
    workload's luck."""
    figures = {
        side: {r["seed"]: r["short_p95"] for r in rows if (r["setting"], r["load"]) == side}
        for side in (low, high)
    }
    seeds = sorted(figures[low])
    good = bool(seeds) and all(figures[low][k] < figures[high][k] for k in seeds)
    pairs = ", ".join(f"{figures[low][k]:.1f} < {figures[high][k]:.1f}" for k in seeds)
    return (
        f"{low[0]} at {low[1]:.0%} under {high[0]} at {high[1]:.0%}, seed by seed ({pairs})",
        good,
    )


def checks(
    rows: list[dict[str, Any]], loads: tuple[float, ...], names: tuple[str, ...]
) -> list[Check]:
    """What the literature agrees on, each where the run has both sides of it, on short flows'
    (under :data:`SHORT`) p95 slowdown: ECN-based rate control keeps queues, so short flows'
    tails, below PFC alone's (DCQCN, SIGCOMM 2015); shallow marking below deep marking (the
    buffer a scheme keeps occupied, HPCC, SIGCOMM 2019); and a higher load lengthens the tail."""
    out = [("every flow completed", all(r["completed"] == r["flows"] for r in rows))]
    for load in loads:
        if {"pfc", "dcqcn-paper"} <= set(names):
            out.append(below(rows, ("dcqcn-paper", load), ("pfc", load)))
        if {"dcqcn-paper", "dcqcn-hpcc"} <= set(names):
            out.append(below(rows, ("dcqcn-paper", load), ("dcqcn-hpcc", load)))
    if len(loads) >= 2 and "dcqcn-paper" in names:
        out.append(below(rows, ("dcqcn-paper", min(loads)), ("dcqcn-paper", max(loads))))
    return out


def fct(seed: int, mode: Mode) -> tuple[list[dict[str, Any]], list[str], bool]:
    names = mode.settings or SETTINGS
    unknown = sorted(set(names) - set(SETTINGS))
    if unknown:
        raise ValueError(f"fct: no setting {unknown}; it has {', '.join(SETTINGS)}")
    loads = mode.loads or LOADS
    cdf = mode.cdf or "websearch"
    where = Path(mode.topology).name if mode.topology else "the leaf-spine (8 hosts)"
    base = tomllib.loads(Path(mode.topology).read_text() if mode.topology else leaf_spine(2, 4, 2))
    count = mode.flows or FLOWS
    seeds = range(seed, seed + (mode.iterations or SEEDS))
    quiet = replace(mode, record=None)  # the map's recording: the first seed's runs
    rows = [
        run_one(base, setting, load, k, count, cdf, mode if k == seed else quiet)
        for load in loads
        for setting in names
        for k in seeds
    ]
    lines = [
        f"# {cdf} flows at {', '.join(f'{x:.0%}' for x in loads)} load on {where}: "
        f"{count} flows a run, seeds {seeds[0]}-{seeds[-1]}; slowdown: mean [min-max] over seeds"
    ]
    for load in loads:
        for setting in names:
            lines += _table(rows, load, setting)
    check, ok = check_lines(checks(rows, loads, names))
    return rows, lines + check, ok


def _draw(plt: Any, rows: list[dict[str, Any]]) -> Any:
    """p50 and p95 slowdown against flow size, a panel per load, a line per setting (the
    mean over seeds, the band its range), as the HPCC paper draws its figures."""
    loads = sorted({r["load"] for r in rows})
    names = list(dict.fromkeys(r["setting"] for r in rows))
    fig, axes = plt.subplots(2, len(loads), figsize=(5.5 * len(loads), 7), squeeze=False)
    for col, load in enumerate(loads):
        for row, q in enumerate(("p50", "p95")):
            ax = axes[row, col]
            for setting in names:
                mine = [r for r in rows if r["load"] == load and r["setting"] == setting]
                lows = sorted({b["bytes"][0] for r in mine for b in r["buckets"]})
                xs, mean, lo, hi = [], [], [], []
                for low in lows:
                    cells = [b[q] for r in mine for b in r["buckets"] if b["bytes"][0] == low]
                    if len(cells) == len(mine):
                        xs.append(max(low, 1_000) * 3.16)  # the bucket's middle on a log axis
                        mean.append(statistics.fmean(cells))
                        lo.append(min(cells))
                        hi.append(max(cells))
                ax.plot(xs, mean, marker="o", label=setting)
                ax.fill_between(xs, lo, hi, alpha=0.15, linewidth=0)
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.set_title(f"{q} FCT slowdown, {load:.0%} load")
            ax.set_xlabel("flow size (bytes, decade buckets)")
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=7)
    return fig


SCENARIO = Scenario(
    "fct",
    lambda seed, mode: _outcome(*fct(seed, mode)),
    units="",
    takes=frozenset({"topology", "settings", "iterations", "flows", "loads", "cdf"}),
    exact=True,
)


def _outcome(rows: list[dict[str, Any]], lines: list[str], ok: bool) -> Outcome:
    return Outcome(rows, lines, ok, partial(plotted(_draw), rows))
