"""``rocev2-emu scenario ecmp-entropy --virtual``: ECMP collisions of collective traffic, and
what Meta's fabric did about them (Gangidi et al., SIGCOMM 2024, section on routing).

A leaf-spine of 32 hosts: 4 leaves of 8 hosts (100 Gbit/s), 4 spines, 200 Gbit/s uplinks, so a
leaf's 8 hosts can send across the spines at full rate only if their flows spread evenly, two
per uplink.  Two collectives, each run under five settings of path selection and QPs per
connection (5-tuple ECMP with 1, 4 and 8 QPs; the 5-tuple and the destination QP (E-ECMP)
with 8 QPs; path pinning by destination with 1 QP):

* a ring all-reduce in rank order over ranks whose neighbours sit under other leaves (the
  file lists the leaves' hosts in turn, as a scheduler that scatters a job does), 8 MiB per
  rank: all 32 hops cross the spines at once, 8 flows out of every leaf - the "few, large
  flows" of collective traffic, and the ring runs at its slowest hop;
* all-to-all, 1 MiB per rank (32 KiB to each of 31 peers).

``--size`` sets the all-reduce's bytes per rank, the all-to-all's an eighth of it (with
processes, 8 hosts: 2 MiB and 256 KiB by default).

Per run: the load of every spine link (bytes each leaf sent each spine and each spine sent each
leaf) as max / mean - 1.0 is a perfect spread - and the busbw.  The checks: with 1 QP the
5-tuple collides (max / mean of the all-reduce's spine links at least 1.3), and 8 QPs with QPN
hashing spread it (a lower max / mean) and raise its busbw.
"""

from __future__ import annotations

import statistics
import tomllib
from typing import Any

import numpy as np

from collectives.comm.communicator import Communicator
from collectives.comm.session import BUS_FACTOR
from collectives.jobs.failures import failures
from collectives.jobs.launch import run_recorded, run_topology_data
from collectives.jobs.registry import job
from collectives.scenarios.common import grouped_bars, job_fields, shown, value_check
from rocev2_emu.experiments import harness
from rocev2_emu.experiments.harness import check_lines
from rocev2_emu.experiments.plots import plotted
from rocev2_emu.topology.file import parse
from rocev2_emu.topology.generate import leaf_spine
from rocev2_emu.topology.model import NodeKind, Topology

SETTINGS = (  # name, [fabric] ecmp, QPs per connection
    ("5-tuple, 1 QP", "5-tuple", 1),
    ("5-tuple, 4 QPs", "5-tuple", 4),
    ("5-tuple, 8 QPs", "5-tuple", 8),
    ("QPN hashing, 8 QPs", "5-tuple+qpn", 8),
    ("path pinning, 1 QP", "destination", 1),
)
ALL_REDUCE_BYTES = 8 << 20  # per rank; the all-to-all's: an eighth of it
ALL_REDUCE_BYTES_PROCESSES = 2 << 20  # 8 hosts, 2 leaves of 4, 2 spines


def workloads(all_reduce_bytes: int) -> tuple[tuple[str, str, int], ...]:
    """name, collective, bytes per rank."""
    return (
        ("all-reduce", "all_reduce", all_reduce_bytes),
        ("all-to-all", "all_to_all", max(all_reduce_bytes // 8, 4096)),
    )


def entropy_data(seed: int, ecmp: str, small: bool = False, tdf: float = 1.0) -> dict[str, Any]:
    """The leaf-spine (``small``: 2 leaves of 4 hosts and 2 spines, for processes), its hosts
    listed one leaf after another in turn (h0 under leaf0, h8 under leaf1, ...), so that rank
    order puts every ring neighbour under another leaf."""
    leaves, per, spines = (2, 4, 2) if small else (4, 8, 4)
    data = tomllib.loads(leaf_spine(spines, leaves, per, tdf=tdf))
    data["fabric"].update(seed=seed, ecmp=ecmp)
    data["host"].sort(key=lambda h: (int(h["name"][1:]) % per, int(h["name"][1:]) // per))
    for link in data["link"]:
        if link["a"].startswith("spine") or link["b"].startswith("spine"):
            link["rate_gbps"] = 200.0
    return data


def entropy_topology(seed: int, ecmp: str) -> Topology:
    return parse(entropy_data(seed, ecmp), "ecmp-entropy.toml")


def spine_loads(topo: Topology, port_tx: dict[str, list[int]]) -> list[int]:
    """Bytes sent on every link between two switches (in a leaf-spine: a leaf and a spine),
    both directions."""
    return [
        port_tx[sw.name][k]
        for sw in topo.switches
        for k, (_, peer) in enumerate(sw.ports)
        if topo.nodes[peer].kind is NodeKind.SWITCH
    ]


@job("entropy_op")
async def entropy_op(comm: Communicator, p: dict[str, Any]) -> dict[str, Any]:
    """One warm-up operation of 4 KiB per rank (it makes the links), then the measured one of
    ``p["bytes"]``: its time from a barrier to this rank's end, and whether it is right."""
    n, r = comm.size, comm.rank
    count = int(p["bytes"]) // 4 // n * n
    a2a = p["coll"] == "all_to_all"

    async def op(x: np.ndarray) -> np.ndarray:
        return await (comm.all_to_all(x) if a2a else comm.all_reduce(x, algo="ring"))

    await op(np.full(1024 // n * n, r + 1, np.float32))
    await comm.barrier()
    start = comm.ctx.now()
    got = await op(np.full(count, r + 1, np.float32))
    elapsed = comm.ctx.now() - start
    if a2a:
        want = np.repeat(np.arange(1, n + 1, dtype=np.float32), count // n)
    else:
        want = np.full(count, n * (n + 1) / 2, np.float32)
    return {"time": elapsed, "bytes": count * 4, "wrong": comm.mismatches(got, want)}


def one(
    seed: int,
    ecmp: str,
    qps: int,
    coll: str,
    size: int,
    tdf: float | None = None,
    mode: harness.Mode | None = None,
) -> dict[str, Any]:
    """One workload under one setting, in virtual time (``tdf`` None) or with processes;
    recorded, or watched live, as the scenario's ``mode`` says."""
    p = {
        "coll": coll,
        "bytes": size,
        "order": "rank",  # the ring in rank order: every hop crosses the spines
        "qps_per_connection": qps,
        "slot_bytes": 64 << 10,  # 31 links per rank in the all-to-all: keep their slots small
        "timeout": 1.0,
    }
    if tdf is None:
        topo = entropy_topology(seed, ecmp)
        label = f"{coll}-{ecmp}-x{qps}"
        results, fab = run_recorded(topo, "entropy_op", p, label, mode)
    else:
        data = entropy_data(seed, ecmp, small=True, tdf=tdf)
        topo = parse(data, "ecmp-entropy.toml")
        results, fab = run_topology_data(data, "ecmp-entropy", tdf, "entropy_op", p, mode=mode)
    bad = {r: v for r, v in results.items() if not (isinstance(v, dict) and "time" in v)}
    if bad:
        raise RuntimeError(f"ecmp-entropy {coll} {ecmp} x{qps}: " + "; ".join(failures(bad)))
    t = max(v["time"] for v in results.values())
    n = len(results)
    loads = spine_loads(topo, fab["port_tx_bytes"])
    mean = statistics.fmean(loads)
    return {
        "time": t,
        "busbw": results[0]["bytes"] / t * BUS_FACTOR[coll](n) / 1e9 if t else 0.0,
        "imbalance": max(loads) / mean if mean else 0.0,
        "spine_loads": loads,
        "ecn_marked": fab["ecn_marked"],
        **job_fields(results, fab),
    }


def entropy(
    seed: int, tdf: float | None = None, mode: harness.Mode | None = None
) -> tuple[list[dict[str, Any]], list[str], bool]:
    """Every workload under every setting: 32 hosts in virtual time, or 8 as processes."""
    rows: list[dict[str, Any]] = []
    lines: list[str] = []
    default = ALL_REDUCE_BYTES if tdf is None else ALL_REDUCE_BYTES_PROCESSES
    for workload, coll, size in workloads((mode.size if mode else None) or default):
        for setting, ecmp, qps in SETTINGS:
            got = one(seed, ecmp, qps, coll, size, tdf, mode)
            rows.append({"workload": workload, "setting": setting, **got})
            lines.append(
                f"{workload:>10}, {setting:<19}: spine links max/mean {got['imbalance']:.2f}, "
                f"busbw {got['busbw']:.2f} GB/s ({got['time'] * 1e6:.0f} us), ECN marks "
                f"{got['ecn_marked']}, PFC frames {got['pfc_tx']}, wrong {shown(got['wrong'])}"
                + (f", {got['late_wakeups']} late wake-ups" if got["late_wakeups"] else "")
            )
    if tdf is not None:  # 8 hosts: four flows per leaf over two uplinks; figures, one check
        lines.append("# with processes at this size the spread is reported, not checked")
        check, ok = check_lines(value_check(rows))
        return rows, lines + check, ok
    by = {(r["workload"], r["setting"]): r for r in rows}
    one_qp = by["all-reduce", "5-tuple, 1 QP"]
    spread = by["all-reduce", "QPN hashing, 8 QPs"]
    checks = [
        *value_check(rows),
        (
            f"with 1 QP the 5-tuple collides: the all-reduce's spine links max/mean "
            f"{one_qp['imbalance']:.2f} >= 1.3",
            one_qp["imbalance"] >= 1.3,
        ),
        (
            f"8 QPs with QPN hashing spread it: max/mean {spread['imbalance']:.2f} < "
            f"{one_qp['imbalance']:.2f}, busbw {spread['busbw']:.2f} > {one_qp['busbw']:.2f} GB/s",
            spread["imbalance"] < one_qp["imbalance"] and spread["busbw"] > one_qp["busbw"],
        ),
    ]
    check, ok = check_lines(checks)
    return rows, lines + check, ok


@plotted
def plot(plt: Any, rows: list[dict[str, Any]]) -> Any:
    """Per workload: spine-link imbalance and busbw for each setting."""
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
    names = [s for s, _, _ in SETTINGS]
    grouped_bars(axes[0], rows, "imbalance", "spine links: max / mean load", names)
    grouped_bars(axes[1], rows, "busbw", "busbw (GB/s)", names)
    small = bool(rows) and len(rows[0]["spine_loads"]) < 32  # 2 x 2 x 2 leaf-spine links
    size = "8 hosts, 2 leaves, 2 spines (processes)" if small else "32 hosts, 4 leaves, 4 spines"
    fig.suptitle(f"ecmp-entropy: {size} (200G uplinks)")
    return fig


def register() -> None:
    """Add ``ecmp-entropy`` to ``rocev2-emu scenario``: virtual time (32 hosts) or processes
    (``--size``)."""
    scale = frozenset({"size"})
    harness.register(harness.job_scenario("ecmp-entropy", entropy, plot, takes=scale))
