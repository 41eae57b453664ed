"""``incast``: N -> 1 (N = 8) with no PFC and no DCQCN (drops, retransmissions), PFC only (no
loss, pauses), PFC + DCQCN (CNPs, fewer pauses), and PFC with every sender's NIC pacing at C/N
(no pause at all), with flow completion times p50 / p99.
"""

from __future__ import annotations

import statistics

from rocev2_emu.experiments.harness import (
    G,
    Mode,
    check_lines,
    fabric_run,
    fabric_scenario,
    settings,
    topology_data,
)
from rocev2_emu.experiments.runs import Run
from rocev2_emu.fabric.agent import FlowSpec
from rocev2_emu.fabric.topogen import single_switch
from rocev2_emu.stats import percentile


def incast(
    seed: int, n: int = 8, size: int = 4 << 20, mode: Mode = Mode()
) -> tuple[list[Run], list[str], bool]:
    if not mode.virtual:
        n, size = min(n, 4), min(size, 1 << 20)
    flows = [FlowSpec(i, f"h{i}", f"h{n}", size) for i in range(n)]
    runs, lines, ok = [], [], True
    for setting, pfc, dcqcn, pacing in (
        ("lossy", False, False, 0.0),
        ("pfc", True, False, 0.0),
        ("pfc+dcqcn", True, True, 0.0),
        ("pfc+pacing", True, False, 100.0 / n),  # the seed's NIC pacing: each at C/N
    ):
        data = topology_data(
            single_switch(n + 1),
            seed,
            **settings(pfc, dcqcn, dcqcn),
            buffer={"size_bytes": 2 << 20, "headroom_bytes": 96 * 1024},
            transport={"qp_timeout": 10, "max_inflight": 256, "pacing_gbps": pacing},
        )
        run = fabric_run(data, flows, ("sw0", n), 20e-6, setting, mode)
        runs.append(run)
        fcts = sorted(r.fct for r in run.results if r.verified)
        fab = run.fabric
        drops = sum(fab["drops"].values())
        p99 = percentile(fcts, 0.99)
        lines.append(
            f"{setting:>10}: FCT p50 {statistics.median(fcts) * 1e6 if fcts else 0:.0f} us, "
            f"p99 {p99 * 1e6:.0f} us; drops {drops}, retransmitted {fab['retransmitted']}, "
            f"PFC frames {fab['pfc_tx']}, CNPs {fab['cnps_sent']}; all verified: "
            f"{len(fcts) == n}"
        )
        ok = ok and len(fcts) == n
    lossy, pfc_only, both, paced = (r.fabric for r in runs)
    ideal = n * size * 8 / (100 * G)  # the receiver's link, full, for everything
    slack = 0.1 if mode.virtual else 0.2  # headers take 2 %; processes add their jitter
    checks = [
        (
            "without PFC the switch drops and go-back-N retransmits",
            sum(lossy["drops"].values()) > 0 and lossy["retransmitted"] > 0,
        ),
        (
            "with PFC nothing is lost and the switch pauses",
            sum(pfc_only["drops"].values()) == 0 and pfc_only["pfc_tx"] > 0,
        ),
        (
            "DCQCN sends CNPs and needs fewer pauses than PFC alone",
            both["cnps_sent"] > 0 and both["pfc_tx"] < pfc_only["pfc_tx"],
        ),
        (
            f"NIC pacing at C/N: no pause, no drop, the last flow within {slack:.0%} of the "
            f"ideal {ideal * 1e6:.0f} us",
            paced["pfc_tx"] == 0
            and sum(paced["drops"].values()) == 0
            and max(r.fct for r in runs[3].results) <= (1 + slack) * ideal,
        ),
    ]
    check, good = check_lines(checks)
    lines += check
    ok = ok and good
    return runs, lines, ok


SCENARIO = fabric_scenario("incast", lambda seed, mode: incast(seed, mode=mode))
