"""``pfc-unfairness``: 4 senders -> 1 receiver, 3 of them behind one upstream switch port.

PFC alone is fair to ports, not flows: the lone sender gets about C/2 and the three about C/6
each.  With DCQCN the four share by flow (the DCQCN paper, SIGCOMM 2015, §2.2).
"""

from __future__ import annotations

import statistics

from rocev2_emu.experiments.harness import (
    Mode,
    fabric_run,
    fabric_scenario,
    jain,
    settings,
    steady_shares,
    topology_data,
)
from rocev2_emu.experiments.runs import Run
from rocev2_emu.fabric.agent import FlowSpec

_UNFAIR = """
[fabric]
name = "pfc-unfairness"
mtu = 4096
[link_defaults]
rate_gbps = 100.0
delay_us = 1.0
[[switch]]
name = "sw0"
[[switch]]
name = "sw1"
[[host]]
name = "h0"
[[host]]
name = "h1"
[[host]]
name = "h2"
[[host]]
name = "h3"
[[host]]
name = "r"
[[link]]
a = "r"
b = "sw0"
[[link]]
a = "h0"
b = "sw0"
[[link]]
a = "sw1"
b = "sw0"
[[link]]
a = "h1"
b = "sw1"
[[link]]
a = "h2"
b = "sw1"
[[link]]
a = "h3"
b = "sw1"
"""


def pfc_unfairness(
    seed: int, size: int = 24 << 20, mode: Mode = Mode()
) -> tuple[list[Run], list[str], bool]:
    if mode.processes:
        size = min(size, 2 << 20)
    flows = [FlowSpec(i, f"h{i}", "r", size) for i in range(4)]
    runs, lines, ok = [], [], True
    for setting, dcqcn in (("pfc", False), ("pfc+dcqcn", True)):
        data = topology_data(_UNFAIR, seed, **settings(True, dcqcn, dcqcn))
        run = fabric_run(data, flows, ("sw0", 0), 100e-6, setting, mode)
        runs.append(run)
        fcts = [r.fct for r in run.results]
        ratio = fcts[0] / statistics.fmean(fcts[1:]) if all(fcts) else 0.0
        if run.times:  # virtual: goodput while all four run
            shares = steady_shares(run)
            lone, rest = shares[0], statistics.fmean(shares[1:])
            lines.append(
                f"{setting:>10}: goodput while all four run: h0 (alone) {lone:.1f}, "
                f"h1-h3 (behind one port) {', '.join(f'{x:.1f}' for x in shares[1:])} "
                f"Gbit/s; Jain {jain(shares):.3f}; link use {sum(shares):.0f} %"
            )
            fair = jain(shares) >= 0.95 and lone < 1.3 * rest
            unfair = lone > 2 * rest
        else:  # processes: the lone sender's completion time against the others'
            lines.append(
                f"{setting:>10}: FCT h0 (alone) {fcts[0] * 1e6:.0f} us, h1-h3 "
                f"{', '.join(f'{x * 1e6:.0f}' for x in fcts[1:])} us; h0 / others "
                f"{ratio:.2f}"
            )
            # PFC alone gives 0.50 exactly (h0 at C/2 finishes first, then the three share
            # C); DCQCN lands between 0.79 and 1.13 over seeds on a 2-core machine.
            fair, unfair = ratio > 0.65, 0 < ratio < 0.6
        good = fair if dcqcn else unfair
        text = (
            "DCQCN shares the link by flow, not by port"
            if dcqcn
            else "PFC alone is fair to ports, not flows (the lone sender gets about C/2)"
        )
        lines.append(f"{'':>10}  check: {text}: {'pass' if good else 'FAIL'}")
        ok = ok and good and all(r.ok for r in run.results)
    return runs, lines, ok


SCENARIO = fabric_scenario("pfc-unfairness", lambda seed, mode: pfc_unfairness(seed, mode=mode))
