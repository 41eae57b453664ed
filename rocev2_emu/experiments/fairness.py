"""``fairness``: four flows join and leave one by one on one bottleneck; Jain's index per phase,
and how the survivors recover when a flow leaves.
"""

from __future__ import annotations

import itertools
import statistics

from rocev2_emu.experiments.harness import (
    G,
    Mode,
    check_lines,
    fabric_run,
    fabric_scenario,
    jain,
    topology_data,
)
from rocev2_emu.experiments.runs import Run
from rocev2_emu.fabric.agent import FlowSpec
from rocev2_emu.topology.generate import single_switch

_FAIR_RATE = 25.0  # Gbit/s: DCQCN's steps are absolute, so a slower link converges sooner
# The ns-3 HPCC simulator's whole DCQCN setting at 25 Gbit/s: its profile, and its RED marking
# (Kmin 100 KB, Kmax 400 KB, Pmax 20 %).  With the paper's profile the flows take far longer
# than a phase to climb back; with NVIDIA's the byte-counter hyper increase overshoots into a
# saw-tooth that cuts every flow to a tenth of its share (see docs/scenarios.md).
_FAIR_DCQCN = {"profile": "hpcc"}
_FAIR_ECN = {"kmin_kb": 100, "kmax_kb": 400, "pmax": 0.2}


def _fairness_flows(n: int, phase: float) -> list[FlowSpec]:
    """Flow i joins at i x phase; sizes are such that, at fair shares C/k, the flows leave in
    reverse order one phase apart (flow n-1 after one phase, flow 0 last)."""
    c = _FAIR_RATE * G / 8  # bytes per second
    active = list(range(1, n + 1)) + list(range(n - 1, 0, -1))  # flows in each phase
    flows = []
    for i in range(n):
        size = sum(c * phase / active[k] for k in range(i, 2 * n - 1 - i))
        flows.append(FlowSpec(i, f"h{i}", f"h{n}", int(size) // 4096 * 4096, start=i * phase))
    return flows


def fairness(
    seed: int, n: int = 4, phase: float = 5e-3, mode: Mode = Mode()
) -> tuple[list[Run], list[str], bool]:
    """Flows join one by one and leave one by one on one 25 Gbit/s bottleneck.  With DCQCN
    each converges to C/k while k run (Jain's index over the last half of each phase), and the
    survivors climb back when a flow leaves."""
    flows = _fairness_flows(n, phase)
    data = topology_data(single_switch(n + 1, rate_gbps=_FAIR_RATE), seed)
    data["dcqcn"].update(_FAIR_DCQCN)
    data["ecn"].update(_FAIR_ECN)
    run = fabric_run(data, flows, ("sw0", n), 50e-6, "pfc+dcqcn", mode)
    ends = [r.start + r.fct for r in run.results]
    bounds = [f.start for f in flows] + sorted(ends)  # phase k: bounds[k] to bounds[k + 1]
    lines, ok = [], all(r.ok for r in run.results)
    jains, per_flow = [], []
    for k in range(len(bounds) - 1):
        lo, hi = bounds[k], bounds[k + 1]
        live = [f.id for f in flows if f.start <= lo and ends[f.id] >= hi]
        picks = [j for j, t in enumerate(run.times) if (lo + hi) / 2 <= t <= hi]
        shares = [statistics.fmean(run.goodput[f][j] for j in picks) for f in live if picks]
        if not shares:  # processes: no time series
            lines.append(f"{'phase ' + str(k):>10}: {len(live)} flows, {(hi - lo) * 1e6:.0f} us")
            continue
        if len(live) > 1:
            jains.append(jain(shares))
        per_flow.append(statistics.fmean(shares))
        lines.append(
            f"{'phase ' + str(k):>10}: {len(live)} flows, {(hi - lo) * 1e6:.0f} us; goodput "
            f"{', '.join(f'{x:.1f}' for x in shares)} Gbit/s (C/{len(live)} = "
            f"{_FAIR_RATE / len(live):.1f}); Jain {jain(shares):.3f}"
        )
    if run.times:
        leaving = per_flow[n - 1 :]  # per-flow goodput from the full house to the last alone
        climbs = [b / a for a, b in itertools.pairwise(leaving)]
        checks = [
            (
                f"Jain's index >= 0.95 in every phase with 2+ flows (worst {min(jains):.3f})",
                min(jains) >= 0.95,
            ),
            (
                "each time a flow leaves the others speed up by >= 15 % (by "
                f"{', '.join(f'{x - 1:.0%}' for x in climbs)}), and the last alone gets >= 90 "
                f"% of C ({leaving[-1] / _FAIR_RATE:.0%})",
                min(climbs) >= 1.15 and leaving[-1] >= 0.9 * _FAIR_RATE,
            ),
        ]
    else:
        order = sorted(range(n), key=lambda i: ends[i])
        checks = [(f"flows leave last-in first-out ({order})", order == list(range(n))[::-1])]
    check, good = check_lines(checks)
    lines += check
    ok = ok and good
    return [run], lines, ok


SCENARIO = fabric_scenario("fairness", lambda seed, mode: fairness(seed, mode=mode))
