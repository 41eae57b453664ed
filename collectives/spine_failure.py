"""``rocev2-emu scenario spine-failure --virtual``: two spines fail during an all-reduce, on a
fabric with spare spine capacity and on one without (Gangidi et al., SIGCOMM 2024: Meta's
training clusters keep spine capacity at 1 : 1.125 of the hosts' so that failed spines cost
little).

Leaf-spines of 32 hosts (4 leaves of 8, 100 Gbit/s links): 9 spines (a leaf's uplinks carry
1.125 times its hosts' 800 Gbit/s) and 8 spines (1 : 1).  A job of 6 ring all-reduces of
1 MiB in rank order over scattered hosts (every ring hop crosses the spines, 8 flows up from
every leaf), 8 QPs per connection and the 5-tuple plus the destination QP hashed (E-ECMP), so
the flows spread over the spines.  During the fourth all-reduce spine0 and spine1 fail: every
link of theirs goes down at once (their queues and the frames on the wire are lost) and the
switches' routes converge around them, as a routing protocol would.  The failure time is the
middle of that all-reduce in a run without failure (virtual time repeats exactly, so it is).

Per fabric: busbw before (all-reduces 1-3), during (4) and after (5-6, two spines short).  The
checks: no byte lost (every value of every all-reduce right, with the failure's losses recovered
by go-back-N), the failure was real (frames dropped with the links), and with spare capacity
the all-reduces after the failure keep more of their busbw than without.
"""

from __future__ import annotations

import statistics
import tomllib
from pathlib import Path
from typing import Any

import numpy as np
import trio

from collectives.communicator import Communicator
from collectives.job import run_virtual
from collectives.registry import job
from collectives.session import BUS_FACTOR
from rocev2_emu.experiments import harness
from rocev2_emu.experiments.harness import check_lines
from rocev2_emu.experiments.plots import pyplot, save
from rocev2_emu.fabric.topogen import leaf_spine
from rocev2_emu.fabric.topology import Topology
from rocev2_emu.fabric.topology_file import parse

FABRICS = (("1 : 1.125 (9 spines)", 9), ("1 : 1 (8 spines)", 8))
FAILED = ("spine0", "spine1")
ITERS, FAIL_AT = 6, 3  # all-reduces, and the one during which the spines fail (from 0)
SIZE = 1 << 20
QPS = 8


def spine_topology(seed: int, spines: int) -> Topology:
    """The leaf-spine, its hosts listed one leaf after another in turn, so that rank order puts
    every ring neighbour under another leaf (as ecmp-entropy does)."""
    data = tomllib.loads(leaf_spine(spines, 4, 8))
    data["fabric"].update(seed=seed, ecmp="5-tuple+qpn")
    data["host"].sort(key=lambda h: (int(h["name"][1:]) % 8, int(h["name"][1:]) // 8))
    return parse(data, "spine-failure.toml")


@job("spine_failure_op")
async def spine_failure_op(comm: Communicator, p: dict[str, Any]) -> dict[str, Any]:
    """``ITERS`` all-reduces, each from a barrier: their start and end, and the wrong values."""
    n, r = comm.size, comm.rank
    count = int(p["bytes"]) // 4 // n * n
    await comm.all_reduce(np.ones(1024, np.float32), algo="ring")  # makes the links
    spans, wrong = [], 0
    for k in range(int(p["iters"])):
        await comm.barrier()
        start = comm.ctx.now()
        got = await comm.all_reduce(np.full(count, r + k + 1, np.float32), algo="ring")
        spans.append((start, comm.ctx.now()))
        wrong += int(np.count_nonzero(got != n * (n + 1) / 2 + n * k))
    return {"spans": spans, "wrong": wrong, "bytes": count * 4}


def _fail(topo: Topology, at: float | None) -> Any:
    """The task that fails ``FAILED`` at emulated time ``at`` (None: no failure)."""

    async def fail(switches: dict[str, Any], agents: dict[str, Any]) -> None:
        if at is None:
            return
        clock = next(iter(switches.values())).clock
        await trio.sleep(max(0.0, at - clock.now()))
        now = clock.now()
        down = {lk.index for lk in topo.links if lk.a in FAILED or lk.b in FAILED}
        for sw in topo.switches:
            core = switches[sw.name].core
            for port, (lk, _) in enumerate(sw.ports):
                if lk.index in down:
                    core.set_link(port, False, now)
        for sw in topo.switches:  # routing converges around the failure
            switches[sw.name].core.set_routes(topo.routes_by_ip(sw.name, frozenset(down)))

    return fail


def run(seed: int, spines: int, at: float | None) -> dict[str, Any]:
    topo = spine_topology(seed, spines)
    p = {
        "bytes": SIZE,
        "iters": ITERS,
        "order": "rank",
        "qps_per_connection": QPS,
        "slot_bytes": 128 << 10,
        "timeout": 1.0,
        "qp_timeout": 6,  # 262 us: the frames lost with the links are sent again soon
    }
    results, fab = run_virtual(topo, "spine_failure_op", p, beside=_fail(topo, at))
    bad = {r: v for r, v in results.items() if not (isinstance(v, dict) and "spans" in v)}
    if bad:
        raise RuntimeError(f"spine-failure {spines} spines: ranks failed: {list(bad.items())[:2]}")
    spans = [
        (
            min(v["spans"][k][0] for v in results.values()),
            max(v["spans"][k][1] for v in results.values()),
        )
        for k in range(ITERS)
    ]
    n = len(results)
    nbytes = results[0]["bytes"]
    busbw = [nbytes / (e - s) * BUS_FACTOR["all_reduce"](n) / 1e9 for s, e in spans]
    return {
        "spans": spans,
        "busbw": busbw,
        "wrong": sum(v["wrong"] for v in results.values()),
        "link_down_drops": fab["drops"].get("link_down", 0),
        "retransmitted": fab.get("retransmitted", 0),
        "pfc_tx": fab["pfc_tx"],
    }


def spine_failure(seed: int) -> tuple[list[dict[str, Any]], list[str], bool]:
    rows: list[dict[str, Any]] = []
    lines: list[str] = []
    for name, spines in FABRICS:
        quiet = run(seed, spines, None)
        s, e = quiet["spans"][FAIL_AT]
        got = run(seed, spines, (s + e) / 2)
        bw = got["busbw"]
        row = {
            "fabric": name,
            "spines": spines,
            "before": statistics.fmean(bw[:FAIL_AT]),
            "during": bw[FAIL_AT],
            "after": statistics.fmean(bw[FAIL_AT + 1 :]),
            "quiet_after": statistics.fmean(quiet["busbw"][FAIL_AT + 1 :]),
            **got,
        }
        row["kept"] = row["after"] / row["before"]
        rows.append(row)
        lines.append(
            f"{name:<21}: busbw before {row['before']:.2f}, during {row['during']:.2f}, after "
            f"{row['after']:.2f} GB/s ({row['kept']:.0%} kept; {row['quiet_after']:.2f} without "
            f"the failure); {got['link_down_drops']} frames lost with the links, "
            f"{got['retransmitted']} retransmitted, wrong {got['wrong']}"
        )
    spare, tight = rows
    checks = [
        ("no byte lost: every value right", all(r["wrong"] == 0 for r in rows)),
        (
            "the failure was real: frames lost with the links and sent again",
            all(r["link_down_drops"] > 0 and r["retransmitted"] > 0 for r in rows),
        ),
        (
            f"spare spines cost less: {spare['kept']:.0%} of busbw kept with 9 spines, "
            f"{tight['kept']:.0%} with 8",
            spare["kept"] > tight["kept"],
        ),
    ]
    check, ok = check_lines(checks)
    return rows, lines + check, ok


def plot(rows: list[dict[str, Any]], path: Path) -> bool:
    """busbw of every all-reduce, per fabric, the failure marked."""
    plt = pyplot()
    if plt is None:
        return False
    fig, ax = plt.subplots(figsize=(7, 3.8))
    for r in rows:
        ax.plot(range(1, ITERS + 1), r["busbw"], marker="o", label=r["fabric"])
    ax.axvline(FAIL_AT + 1, color="grey", linestyle="--", label="spine0, spine1 fail")
    ax.set_xlabel("all-reduce")
    ax.set_ylabel("busbw (GB/s)")
    ax.legend(fontsize=8)
    fig.suptitle("spine-failure: 32 hosts, ring all-reduce of 1 MiB, E-ECMP with 8 QPs")
    return save(plt, fig, path)


def register() -> None:
    """Add ``spine-failure`` to ``rocev2-emu scenario`` (virtual time)."""
    harness.register(harness.virtual_scenario("spine-failure", spine_failure, plot))
