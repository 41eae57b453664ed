"""``dilation``: a 4:1 incast with PFC at TDF T and 2T with real processes, and in virtual time:
the emulated completion times agree within 10 %, or the time dilation is not doing its job.
"""

from __future__ import annotations

import statistics

from rocev2_emu.experiments.harness import (
    Mode,
    fabric_run,
    fabric_scenario,
    settings,
    topology_data,
)
from rocev2_emu.experiments.runs import Run
from rocev2_emu.fabric.agent import FlowSpec
from rocev2_emu.fabric.options import Clock, RunOptions
from rocev2_emu.topology.generate import single_switch


def dilation(
    seed: int, mode: Mode = Mode(RunOptions(Clock.WALL))
) -> tuple[list[Run], list[str], bool]:
    """A 4:1 incast with PFC at two TDFs (and in virtual time as the reference): the emulated
    completion times must agree within 10 %, or the time dilation is not doing its job."""
    flows = [FlowSpec(i, f"h{i}", "h4", 1 << 20) for i in range(4)]
    data = topology_data(single_switch(5), seed, **settings(True, False, False))
    reference = Mode(record=mode.record)  # recorded for the map's replay, if asked
    runs = [fabric_run(data, flows, ("sw0", 4), 20e-6, "virtual", reference)]
    for tdf in (mode.tdf, 2 * mode.tdf):
        watched = Mode(
            RunOptions(Clock.WALL, tdf), ui=mode.ui
        )  # the live map beside each, with --ui
        runs.append(fabric_run(data, flows, ("sw0", 4), 20e-6, f"TDF {tdf:g}", watched))
    lines, p50 = [], []
    for run in runs:
        fcts = sorted(r.fct for r in run.results)
        p50.append(statistics.median(fcts))
        lines.append(
            f"{run.setting:>10}: FCT p50 {p50[-1] * 1e6:.1f} us, max {fcts[-1] * 1e6:.1f}"
            f" us, PFC frames {run.fabric['pfc_tx']}, late wake-ups "
            f"{run.fabric['late_wakeups']}"
        )
    diff = abs(p50[1] - p50[2]) / p50[2]
    good = diff <= 0.10 and all(r.ok for run in runs for r in run.results)
    lines.append(
        f"{'':>10}  check: FCT p50 at the two TDFs within 10 % ({diff * 100:.1f} %), "
        f"the virtual run {abs(p50[0] - p50[2]) / p50[2] * 100:.1f} % away: "
        f"{'pass' if good else 'FAIL'}"
    )
    return runs, lines, good


SCENARIO = fabric_scenario("dilation", lambda seed, mode: dilation(seed, mode), exact=False)
