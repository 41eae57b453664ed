"""``fluid-model``: N = 2, 4, 8 long flows; the steady queue against the DCQCN fluid model's
fixed point (Zhu et al., CoNEXT 2016; :mod:`rocev2_emu.experiments.fluid`).
"""

from __future__ import annotations

import math
import statistics

from rocev2_emu.cc import PROFILES
from rocev2_emu.experiments.fluid import Bottleneck, fixed_point, integrate
from rocev2_emu.experiments.harness import (
    G,
    Mode,
    fabric_run,
    fabric_scenario,
    topology_data,
)
from rocev2_emu.experiments.runs import Run
from rocev2_emu.fabric.agent import FlowSpec
from rocev2_emu.topology.generate import single_switch

# The paper's DCQCN profile on a 10 Gbit/s bottleneck, with RED between 100 and 400 KB up to
# 20 %: with 4 KB frames the fixed points of N = 2, 4, 8 then sit inside RED's ramp (the
# paper's 5 KB / 200 KB / 1 % suits 1 KB frames at 40 Gbit/s, where marks come 4 x as often).
_FLUID_RATE = 10.0
_FLUID_ECN = {"kmin_kb": 100, "kmax_kb": 400, "pmax": 0.2}
_FRAME = 4154  # bytes per full data frame at the switch: Ethernet + IPv4 + UDP + BTH + 4 KiB + ICRC


def fluid_model(
    seed: int, ns: tuple[int, ...] = (2, 4, 8), duration: float = 30e-3, mode: Mode = Mode()
) -> tuple[list[Run], list[str], bool]:
    """N long flows on one bottleneck: the emulated steady-state queue and marking rate next
    to the DCQCN fluid model's fixed point (Zhu et al., CoNEXT 2016), which
    :mod:`rocev2_emu.experiments.fluid` integrates.  The check: the mean queue within 20 %."""
    if not mode.virtual:
        duration = min(duration, 10e-3)
    runs, lines, ok = [], [], True
    for n in ns:
        size = int(_FLUID_RATE * G / 8 * duration / n) // 4096 * 4096
        flows = [FlowSpec(i, f"h{i}", f"h{n}", size) for i in range(n)]
        data = topology_data(single_switch(n + 1, rate_gbps=_FLUID_RATE), seed)
        data["ecn"].update(_FLUID_ECN)
        run = fabric_run(data, flows, ("sw0", n), 100e-6, f"N={n}", mode)
        runs.append(run)
        ok = ok and all(r.ok for r in run.results)
        link = Bottleneck(
            _FLUID_RATE * G,
            n,
            _FLUID_ECN["kmin_kb"] * 1000,
            _FLUID_ECN["kmax_kb"] * 1000,
            _FLUID_ECN["pmax"],
            _FRAME,
        )
        dp = PROFILES["paper"]
        p_fix, q_fix, alpha_fix = fixed_point(dp, link)
        fluid = integrate(dp, link, duration)
        tail = fluid.times >= duration / 2
        q_fluid = float(fluid.queue[tail].mean())
        run.queue_reference = q_fix
        if not run.times:  # processes: no series to average; marks over the whole run
            data_packets = sum(math.ceil(r.size / 4096) for r in run.results)
            lines.append(
                f"{run.setting:>10}: marked {run.fabric['ecn_marked'] / data_packets:.4f} of data "
                f"frames over the whole run (start included); fluid model: queue "
                f"{q_fix / 1e3:.0f} KB, p {p_fix:.4f}"
            )
            continue
        end = min(r.start + r.fct for r in run.results)
        picks = [k for k, t in enumerate(run.times) if end / 2 <= t <= 0.95 * end]
        q_emu = statistics.fmean(run.queue[k] for k in picks)
        a, b = picks[0], picks[-1]
        p_emu = (run.marked[b] - run.marked[a]) / max(1, run.sent[b] - run.sent[a])
        err = abs(q_emu - q_fix) / q_fix
        good = err <= 0.20
        ok = ok and good
        lines.append(
            f"{run.setting:>10}: queue {q_emu / 1e3:.0f} KB emulated, {q_fix / 1e3:.0f} KB fixed "
            f"point ({q_fluid / 1e3:.0f} KB integrated); marking {p_emu:.4f} emulated, "
            f"{p_fix:.4f} fixed point; alpha* {alpha_fix:.3f}"
        )
        lines.append(
            f"{'':>10}  check: queue within 20 % of the fixed point ({err:.0%}): "
            f"{'pass' if good else 'FAIL'}"
        )
    return runs, lines, ok


SCENARIO = fabric_scenario("fluid-model", lambda seed, mode: fluid_model(seed, mode=mode))
