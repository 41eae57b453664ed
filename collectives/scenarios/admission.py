"""``rocev2-emu scenario admission --virtual``: PFC alone, PFC with DCQCN, and PFC with
receiver-driven admission, under collective traffic (Gangidi et al., SIGCOMM 2024, on
congestion control: Meta's 400G training fabric runs PFC and receiver-driven traffic admission
in the collective library, without DCQCN, which it found hard to tune).

A leaf-spine of 32 hosts (4 leaves of 8, 4 spines, 100 Gbit/s everywhere: 2:1 oversubscribed at
the leaves) in virtual time, two workloads, each under four settings (with processes: 8 hosts,
2 leaves of 4, 2 spines, 16 KiB per pair 3 times and a 4:1 incast of 1 MiB 4 times):

* ``all-to-all``: every rank sends 64 KiB to each of the 31 others (2 MiB per rank), 4 times;
* ``incast 8:1``: the 8 ranks under leaf1 send 1 MiB each to rank 0 under leaf0 at once (an
  all-to-all-v where only they send: a gather's traffic), 12 times: 8 x 100 Gbit/s into one
  100 Gbit/s port.

Settings: ``PFC only`` (DCQCN off; the collectives' default window: 4 slots of 256 KiB per
link); ``PFC + DCQCN`` (the paper-profile DCQCN on, same window); ``PFC + admission`` (DCQCN
off, a window of 2 slots of 64 KiB: a sender writes a chunk only into a slot its receiver has
granted); ``PFC + admission, grants at DSCP 48`` (the same window, the grants on a QP of their
own at a high-priority DSCP, as Meta's grants travel).

``--iterations N`` runs each workload N times.

Per run: the operations' completion time p50 / p99 (each from a barrier to the last rank's end,
emulated; 4 and 12 samples, so p99 is near the slowest), the pause frames, the deepest egress
queue of any switch port, ECN marks, drops, and the most chunks a link ever had in flight
(written, not yet granted back) against its window.
The report states which setting the run favours, whichever way it comes out; the check fails
only on broken mechanics: a wrong value, a drop on the lossless class, or a link whose receiver
ever held more chunks than its window (a sender writing more than it was granted).
"""

from __future__ import annotations

import statistics
import tomllib
from dataclasses import dataclass
from typing import Any

import numpy as np

from collectives.comm.communicator import Communicator, tally
from collectives.comm.links import RdmaRx, RdmaTx
from collectives.jobs.failures import failures
from collectives.jobs.launch import run_recorded, run_topology_data
from collectives.jobs.registry import job
from collectives.scenarios.common import grouped_bars, job_fields, value_check
from rocev2_emu.experiments import harness
from rocev2_emu.experiments.harness import check_lines
from rocev2_emu.experiments.plots import plotted
from rocev2_emu.topology.file import parse
from rocev2_emu.topology.generate import leaf_spine

SETTINGS: tuple[tuple[str, bool, dict[str, Any]], ...] = (  # name, DCQCN on, job parameters
    ("PFC only", False, {}),
    ("PFC + DCQCN", True, {}),
    ("PFC + admission", False, {"slots": 2, "slot_bytes": 64 << 10}),
    (
        "PFC + admission, grants DSCP 48",
        False,
        {"slots": 2, "slot_bytes": 64 << 10, "grant_dscp": 48},
    ),
)


@dataclass(frozen=True, slots=True)
class Scale:
    """The fabric and the workloads' sizes: 32 hosts in virtual time, 8 with processes."""

    leaves: int
    per_leaf: int
    spines: int
    workloads: tuple[tuple[str, int, int], ...]  # name, bytes each sender sends, iterations


VIRTUAL = Scale(4, 8, 4, (("all-to-all", 64 << 10, 4), ("incast 8:1", 1 << 20, 12)))
PROCESSES = Scale(2, 4, 2, (("all-to-all", 16 << 10, 3), ("incast 4:1", 1 << 20, 4)))


def admission_data(seed: int, dcqcn: bool, scale: Scale, tdf: float) -> dict[str, Any]:
    """The topology file's contents."""
    data = tomllib.loads(leaf_spine(scale.spines, scale.leaves, scale.per_leaf, tdf=tdf))
    data["fabric"]["seed"] = seed
    data["dcqcn"]["enabled"] = dcqcn
    return data


@job("admission_op")
async def admission_op(comm: Communicator, p: dict[str, Any]) -> dict[str, Any]:
    """``p["iters"]`` operations of the workload, each timed from a barrier to this rank's
    end; then the fullest any of this rank's receive links ever was, and its window."""
    n, r = comm.size, comm.rank
    per = int(p["bytes"]) // 4  # float32 elements each sender sends each receiver
    incast = str(p["workload"]).startswith("incast")
    per_leaf = int(p["per_leaf"])
    senders = range(per_leaf, 2 * per_leaf)  # the ranks under leaf1
    if incast:
        sends = [per if (r in senders and j == 0) else 0 for j in range(n)]
        recvs = [per if (r == 0 and i in senders) else 0 for i in range(n)]
    else:
        sends = [per if j != r else 0 for j in range(n)]
        recvs = [per if i != r else 0 for i in range(n)]
    x = np.full(sum(sends), r + 1, np.float32)
    want = np.repeat(np.arange(1, n + 1, dtype=np.float32), recvs)
    times: list[float] = []
    wrong: list[int | None] = []
    await comm.all_to_all_v(x[:0], [0] * n, [0] * n)  # makes every pair's link, unmeasured
    for _ in range(int(p["iters"])):
        await comm.barrier()
        start = comm.ctx.now()
        got = await comm.all_to_all_v(x, sends, recvs)
        times.append(comm.ctx.now() - start)
        wrong.append(comm.mismatches(got, want))
    rings = comm.rings.values()
    links = [(r.rx.peak_held, r.rx.slots) for r in rings if isinstance(r.rx, RdmaRx)]
    in_flight = max((r.tx.peak_in_flight for r in rings if isinstance(r.tx, RdmaTx)), default=0)
    return {"times": times, "wrong": tally(wrong), "links": links, "in_flight": in_flight}


def one(
    seed: int,
    workload: str,
    size: int,
    iters: int,
    dcqcn: bool,
    extra: dict[str, Any],
    scale: Scale,
    tdf: float | None,
    label: str = "",
    mode: harness.Mode | None = None,
) -> dict[str, Any]:
    """One workload under one setting: in virtual time (``tdf`` None) or with processes;
    recorded as ``label``, or watched live, as the scenario's ``mode`` says."""
    p = {
        "workload": workload,
        "bytes": size,
        "iters": iters,
        "per_leaf": scale.per_leaf,
        "timeout": 1.0,
        **extra,
    }
    data = admission_data(seed, dcqcn, scale, tdf or 1.0)
    if tdf is None:
        topo = parse(data, "admission.toml")
        results, fab = run_recorded(topo, "admission_op", p, label, mode)
    else:
        results, fab = run_topology_data(data, "admission", tdf, "admission_op", p, mode=mode)
    bad = {r: v for r, v in results.items() if not (isinstance(v, dict) and "times" in v)}
    if bad:
        raise RuntimeError(f"admission {workload}: " + "; ".join(failures(bad)))
    # an operation ends when its last rank does
    per_op = [max(v["times"][k] for v in results.values()) for k in range(iters)]
    links = [link for v in results.values() for link in v["links"]]
    over = [held for held, slots in links if held > slots]
    one_op = len(per_op) < 2  # --iterations 1: its p99 is its only time
    p99 = per_op[0] if one_op else statistics.quantiles(per_op, n=100, method="inclusive")[98]
    return {
        "p50": statistics.median(per_op),
        "p99": p99,
        "times": per_op,
        "peak_queue_bytes": fab.get("peak_queue_bytes", 0),
        "ecn_marked": fab["ecn_marked"],
        "cnps": fab.get("cnps_sent", 0),
        "drops": sum(fab["drops"].values()),
        "links": len(links),
        "over_window": len(over),
        "peak_held": max((h for h, _ in links), default=0),
        "in_flight": max(v["in_flight"] for v in results.values()),
        "window": max((s for _, s in links), default=0),
        **job_fields(results, fab),
    }


def admission(
    seed: int, tdf: float | None = None, mode: harness.Mode | None = None
) -> tuple[list[dict[str, Any]], list[str], bool]:
    """Every workload under every setting: in virtual time, or with processes at ``tdf``."""
    scale = VIRTUAL if tdf is None else PROCESSES
    every = mode.iterations if mode is not None else None  # --iterations: each workload's
    rows: list[dict[str, Any]] = []
    lines: list[str] = []
    for workload, size, default in scale.workloads:
        iters = every or default
        for setting, dcqcn, extra in SETTINGS:
            label = f"{workload}-{setting}"
            got = one(seed, workload, size, iters, dcqcn, extra, scale, tdf, label, mode)
            rows.append({"workload": workload, "setting": setting, **got})
            lines.append(
                f"{workload:>10}, {setting:<31}: p50 {got['p50'] * 1e6:7.1f} us, p99 "
                f"{got['p99'] * 1e6:7.1f} us, pause frames {got['pfc_tx']:5d}, peak queue "
                f"{got['peak_queue_bytes'] / 1024:6.0f} KiB, ECN marks {got['ecn_marked']}, "
                f"drops {got['drops']}, most chunks in flight on a link "
                f"{got['in_flight']}/{got['window']}"
            )
            if tdf is not None and got["late_wakeups"]:
                lines.append(f"{'':>12}{got['late_wakeups']} late wake-ups at TDF {tdf:g}")
    lines += verdicts(rows, scale)
    checks = [
        *value_check(rows),
        ("no drop on the lossless class (PFC held)", all(r["drops"] == 0 for r in rows)),
        (
            "no receiver ever held more chunks than its window (no write without a grant): "
            f"{sum(r['links'] for r in rows)} links",
            all(r["over_window"] == 0 for r in rows),
        ),
    ]
    check, ok = check_lines(checks)
    return rows, lines + check, ok


def verdicts(rows: list[dict[str, Any]], scale: Scale) -> list[str]:
    """What the run shows, per workload: the setting with the best p99, and the pauses."""
    out = []
    for workload, *_ in scale.workloads:
        mine = {r["setting"]: r for r in rows if r["workload"] == workload}
        best = min(mine.values(), key=lambda r: r["p99"])
        pfc, adm = mine["PFC only"], mine["PFC + admission"]
        dcqcn = mine["PFC + DCQCN"]
        out.append(
            f"# {workload}: best p99 with {best['setting']}; admission vs PFC only: p99 "
            f"{adm['p99'] / pfc['p99']:.2f}x, pause frames {adm['pfc_tx']} vs {pfc['pfc_tx']}, "
            f"peak queue {adm['peak_queue_bytes'] / max(pfc['peak_queue_bytes'], 1):.2f}x; "
            f"DCQCN vs PFC only: p99 {dcqcn['p99'] / pfc['p99']:.2f}x, pause frames "
            f"{dcqcn['pfc_tx']} vs {pfc['pfc_tx']}"
        )
    return out


@plotted
def plot(plt: Any, rows: list[dict[str, Any]]) -> Any:
    """Per workload and setting: p50 / p99 completion and pause frames."""
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    names = [s for s, _, _ in SETTINGS]
    grouped_bars(axes[0], rows, "p50", "completion p50 (us)", names, 1e6)
    grouped_bars(axes[1], rows, "p99", "completion p99 (us)", names, 1e6)
    grouped_bars(axes[2], rows, "pfc_tx", "pause frames", names)
    hosts = (
        "32 hosts, 4 leaves, 4 spines"
        if len(rows) and "8:1" in rows[-1]["workload"]
        else ("8 hosts, 2 leaves, 2 spines (processes)")
    )
    fig.suptitle(f"admission: {hosts}; PFC, DCQCN, receiver-driven window")
    return fig


def register() -> None:
    """Add ``admission`` to ``rocev2-emu scenario``: virtual time (32 hosts) or processes (8)."""
    scale = frozenset({"iterations"})
    harness.register(harness.job_scenario("admission", admission, plot, takes=scale))
