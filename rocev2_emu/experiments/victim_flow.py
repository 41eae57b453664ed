"""``victim-flow``: an incast's pauses spread over three switches and starve a flow whose own
path is idle but shares an uplink with the incast; DCQCN gives it back its line rate.
"""

from __future__ import annotations

import statistics

from rocev2_emu.experiments.harness import (
    G,
    Mode,
    check_lines,
    fabric_run,
    fabric_scenario,
    scenario_topology,
    settings,
    topology_data,
)
from rocev2_emu.experiments.runs import Run
from rocev2_emu.fabric.agent import FlowSpec

# Three leaves under one spine, 400 Gbit/s uplinks (so leaf1's uplink carries four hosts at
# line rate without a queue).  The incast: a1-a3 (under leaf1) and b1-b3 (under leaf2, next
# to the receiver r) -> r.  The victim: v (under leaf1) -> w (under leaf3); its own path
# leaf1 -> spine -> leaf3 is uncongested, but it shares the leaf1 -> spine link with a1-a3.
_VICTIM = scenario_topology(
    "victim-flow",
    ["spine", "leaf1", "leaf2", "leaf3"],
    [
        *[("r", "leaf2"), ("b1", "leaf2"), ("b2", "leaf2"), ("b3", "leaf2"), ("leaf2", "spine")],
        *[("leaf1", "spine"), ("a1", "leaf1"), ("a2", "leaf1"), ("a3", "leaf1"), ("v", "leaf1")],
        *[("leaf3", "spine"), ("w", "leaf3")],
    ],
    uplink_gbps=400.0,
)


def victim_flow(
    seed: int, size: int = 4 << 20, mode: Mode = Mode()
) -> tuple[list[Run], list[str], bool]:
    """PFC alone spreads the incast's pauses past the congested port (leaf2 pauses the spine,
    the spine pauses leaf1), so the victim, stuck behind paused incast frames on leaf1's
    uplink, falls to about the incast senders' per-flow rate.  DCQCN slows the incast at its
    source instead, and the victim keeps the uplink's spare capacity."""
    if mode.processes:
        size = min(size, 2 << 20)
    senders = ["a1", "a2", "a3", "b1", "b2", "b3"]
    flows = [FlowSpec(i, h, "r", size) for i, h in enumerate(senders)]
    # The victim joins a quarter into the incast, once DCQCN (if on) has cut the senders'
    # line-rate start: otherwise the first pauses queue at leaf1's uplink, the victim's
    # frames are marked there too, and with the paper's slow recovery its own cut dominates.
    late = 0.25 * len(senders) * size * 8 / (100 * G)
    flows.append(FlowSpec(len(senders), "v", "w", 3 * size, start=late))
    victim = len(senders)
    runs, lines, rates = [], [], []
    for setting, dcqcn in (("pfc", False), ("pfc+dcqcn", True)):
        data = topology_data(_VICTIM, seed, **settings(True, dcqcn, dcqcn))
        run = fabric_run(data, flows, ("leaf2", 0), 50e-6, setting, mode)
        runs.append(run)
        results = run.results
        incast_fct = sorted(r.fct for r in results[:victim])
        v = results[victim]
        if run.times:  # virtual: the victim's goodput while it and the whole incast ran
            stop = min(v.start + v.fct, min(r.start + r.fct for r in results[:victim]))
            picks = [k for k, t in enumerate(run.times) if v.start + 50e-6 <= t <= stop]
            rate, what = statistics.fmean(run.goodput[victim][k] for k in picks), "during"
        else:  # processes: its mean rate over its life (the incast may end before it does)
            rate, what = v.size * 8 / v.fct / G, "over its life, mostly during"
        rates.append(rate)
        fab = run.fabric
        lines.append(
            f"{setting:>10}: victim v->w {rate:.1f} Gbit/s {what} the incast (FCT "
            f"{v.fct * 1e6:.0f} us); incast "
            f"FCT p50 {statistics.median(incast_fct) * 1e6:.0f} us; PFC frames {fab['pfc_tx']} "
            "sent by "
            f"{', '.join(fab['pfc_senders']) or 'nobody'}; CNPs {fab['cnps_sent']}"
        )
    switches = {"spine", "leaf1", "leaf2", "leaf3"}
    spread = len(set(runs[0].fabric["pfc_senders"]) & switches)
    checks = [
        (
            f"PFC alone: pauses spread to {spread} switches (>= 2 hops) and the victim falls "
            "below half its line rate",
            spread >= 2 and rates[0] < 50,
        ),
        (
            "DCQCN restores the victim: >= 75 % of its line rate and >= 1.5 x its PFC-only rate",
            rates[1] >= 75 and rates[1] >= 1.5 * rates[0],
        ),
    ]
    ok = all(r.ok for run in runs for r in run.results)
    check, good = check_lines(checks)
    lines += check
    ok = ok and good
    return runs, lines, ok


SCENARIO = fabric_scenario("victim-flow", lambda seed, mode: victim_flow(seed, mode=mode))
