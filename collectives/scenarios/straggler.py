"""``rocev2-emu scenario straggler --virtual``: the seed's straggler problem, in virtual time.

Eight ranks (the shipped leaf-spine: 2 spines, 4 leaves, 2 hosts per leaf, one rank each)
run back-to-back ring all-reduces.  Beside them, background hosts (``ranks = 0``) fire
micro-bursts: every ``period`` each of six senders under leaves 1-3 writes ``burst`` bytes to
one receiver under leaf 0.  The bursts converge on the spines' links down to leaf 0 and on the
receiver's port; with PFC alone the pauses spread back over leaf 0's uplinks, which the ring
crosses too, so iterations that meet a burst stall.  Three settings: no bursts (the baseline),
bursts with PFC only, bursts with PFC + DCQCN.

At scale (``--topology FILE``, for example a k = 8 fat-tree's 128 hosts): the file's hosts
are the ranks (as many as their ``ranks`` say, one each by default); the receiver hangs off
the switch of its first host, the six senders two each off the last three switches that hosts
hang off (on the leaf-spine: leaf 0 and leaves 1-3, as above); ``--iterations`` and ``--size``
(bytes per all-reduce) set the job.  Up to :data:`FLAT_RING_RANKS` ranks the all-reduce is a
flat ring, as on the leaf-spine; above, it is the schedule NCCL's tuner would pick
(``algo="auto"``: the tree or rings within rings, :mod:`collectives.comm.cost`).  A flat ring
over 1 024 ranks is 2 046 steps of 128-byte chunks for 256 KiB, about 1 G frame-hops over 40
iterations: a schedule nobody runs at that scale.

Each iteration's time is the latest rank's finish minus the previous iteration's latest
finish; the report gives p50 / p99 / max, the mean of the slowest tenth, the time lost in all
(beyond the quiet run's median iteration), and which rank finished last most often.  The
checks: the p99 grows by at least a quarter under bursts with PFC alone, and with DCQCN both
the slowest tenth and the time lost shrink.  (A single p99 of 40 iterations is one iteration,
and which one meets a burst moves with scheduling; the tenth and the sum do not.)
"""

from __future__ import annotations

import math
import statistics
import tomllib
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from collectives.comm.communicator import Communicator
from collectives.jobs.failures import failures
from collectives.jobs.launch import run_recorded
from collectives.jobs.registry import job
from rocev2_emu.experiments import harness
from rocev2_emu.experiments.harness import check_lines
from rocev2_emu.experiments.plots import plotted
from rocev2_emu.fabric.agent import FlowSpec
from rocev2_emu.stats import percentile
from rocev2_emu.topology.file import parse
from rocev2_emu.topology.generate import leaf_spine
from rocev2_emu.topology.model import Topology


@job("iterations")
async def iterations(comm: Communicator, p: dict[str, Any]) -> list[float]:
    """``p["iters"]`` all-reduces of ``p["bytes"]`` (schedule ``p["algo"]``, ring by default);
    the emulated time each one ended."""
    x = np.ones(int(p["bytes"]) // 4, np.float32)
    algo = str(p.get("algo", "ring"))
    await comm.barrier()
    ends = [comm.ctx.now()]
    for _ in range(int(p["iters"])):
        await comm.all_reduce(x, algo=algo)
        ends.append(comm.ctx.now())
    return ends


def host_switches(data: dict[str, Any]) -> list[str]:
    """The switches that hosts hang off, in the order of the hosts they serve first."""
    switches = {s["name"] for s in data.get("switch", [])}
    hosts = {h["name"] for h in data.get("host", [])}
    under: dict[str, str] = {}
    for link in data.get("link", []):
        for host, switch in ((link["a"], link["b"]), (link["b"], link["a"])):
            if host in hosts and switch in switches:
                under.setdefault(host, switch)
    return list(dict.fromkeys(under[h["name"]] for h in data["host"] if h["name"] in under))


def straggler_topology(seed: int, dcqcn: bool, base: str | None = None) -> Topology:
    """The scenario's fabric: ``base`` (a topology file's text; default the shipped
    leaf-spine), its hosts the ranks, with the bursts' receiver and six senders added."""
    data = tomllib.loads(leaf_spine(2, 4, 2) if base is None else base)
    data["fabric"]["seed"] = seed
    under = host_switches(data)
    if len(under) < 4:
        raise ValueError(
            f"straggler: {len(under)} switches with hosts; the bursts need 4 "
            "(the receiver's and three for the senders)"
        )
    extra = [("bgr", under[0])] + [
        (f"bg{j}{k}", switch) for j, switch in enumerate(under[-3:], 1) for k in (0, 1)
    ]
    for name, switch in extra:
        data["host"].append({"name": name, "ranks": 0})
        data["link"].append({"a": switch, "b": name})
    switches = {s["name"] for s in data["switch"]}
    for link in data["link"]:  # 400 Gbit/s uplinks, as a 100G-host fabric has them
        if link["a"] in switches and link["b"] in switches:
            link["rate_gbps"] = 400.0
    data.setdefault("dcqcn", {})["enabled"] = dcqcn
    data.setdefault("ecn", {})["enabled"] = dcqcn
    if dcqcn:  # mark as the DCQCN paper does, well before PFC engages
        data["ecn"].update(kmin_kb=5, kmax_kb=200, pmax=0.01)
    return parse(data, "straggler.toml")


def bursts(period: float, burst: int, count: int, start: float) -> list[FlowSpec]:
    senders = [f"bg{leaf}{k}" for leaf in (1, 2, 3) for k in (0, 1)]
    return [
        FlowSpec(1000 + b * len(senders) + i, s, "bgr", burst, start=start + b * period)
        for b in range(count)
        for i, s in enumerate(senders)
    ]


def summarize(results: dict[int, list[float]]) -> tuple[list[float], list[int]]:
    """Per iteration: its time (latest finish minus the previous latest) and the last rank."""
    ranks = sorted(results)
    ends = np.array([results[r] for r in ranks])  # rank x (iters + 1)
    latest = ends.max(axis=0)
    times = [float(t) for t in np.diff(latest)]
    last = [ranks[int(k)] for k in ends[:, 1:].argmax(axis=0)]
    return times, last


BURST = 2 << 20  # bytes per sender per burst: 6 senders, 12 MiB towards one 100G port
PERIOD = 1.5e-3  # seconds between bursts
BURSTS = 3
FLAT_RING_RANKS = 128  # above this many ranks, the tuner's schedule instead of a flat ring


def schedule(ranks: int) -> str:
    """The all-reduce's ``algo`` for ``ranks`` ranks (:data:`FLAT_RING_RANKS`)."""
    return "ring" if ranks <= FLAT_RING_RANKS else "auto"


def straggler(
    seed: int, mode: harness.Mode | None = None, iters: int = 40, size: int = 256 << 10
) -> tuple[list[dict[str, Any]], list[str], bool]:
    """The three settings' runs, report lines and verdict; the mode's ``topology``,
    ``iterations`` and ``size`` (bytes per all-reduce), when given, replace the defaults."""
    text = None
    if mode is not None:
        text = Path(mode.topology).read_text() if mode.topology else None
        iters, size = mode.iterations or iters, mode.size or size
    if size % 4 or iters < 1:
        raise ValueError(f"straggler: --size must be a multiple of 4 bytes (float32), got {size}")
    rows: list[dict[str, Any]] = []
    lines: list[str] = []
    algo = "ring"
    for setting, dcqcn, with_bursts in (
        ("quiet", False, False),
        ("pfc", False, True),
        ("pfc+dcqcn", True, True),
    ):
        topo = straggler_topology(seed, dcqcn, text)
        algo = schedule(sum(h.ranks for h in topo.hosts))
        params = {"iters": iters, "bytes": size, "timeout": 0.5, "algo": algo}
        flows = bursts(PERIOD, BURST, BURSTS, 50e-6) if with_bursts else []
        results, fab = run_recorded(topo, "iterations", params, setting, mode, flows=flows)
        bad = {r: v for r, v in results.items() if not isinstance(v, list)}
        if bad:
            raise RuntimeError(f"straggler {setting}: " + "; ".join(failures(bad)))
        times, last = summarize(results)
        p50, p99 = statistics.median(times), percentile(times, 0.99)
        slowest_tenth = sorted(times)[-max(1, math.ceil(len(times) / 10)) :]
        tail = statistics.fmean(slowest_tenth)  # the tail's mean: steadier than one maximum
        base = rows[0]["p50"] if rows else p50  # the quiet run's typical iteration
        lost = sum(max(0.0, t - base) for t in times)
        slowest, n_last = Counter(last).most_common(1)[0]
        rows.append(
            {
                "setting": setting,
                "ranks": len(results),
                "bytes": size,
                "times": times,
                "last": last,
                "p50": p50,
                "p99": p99,
                "tail": tail,
                "lost": lost,
                "max": max(times),
                "fabric": fab,
            }
        )
        lines.append(
            f"{setting:>10}: iteration p50 {p50 * 1e6:.0f} us, p99 {p99 * 1e6:.0f} us, max "
            f"{max(times) * 1e6:.0f} us, slowest tenth {tail * 1e6:.0f} us; {lost * 1e6:.0f} us "
            f"lost in all; last to finish most often: rank {slowest} "
            f"({n_last} of {len(times)}); PFC frames {fab['pfc_tx']} "
            f"(by {', '.join(fab['pfc_senders']) or 'nobody'}), CNPs {fab['cnps_sent']}"
        )
    quiet, pfc, both = rows
    checks = [
        (
            f"bursts stretch the tail with PFC alone (p99 x{pfc['p99'] / quiet['p99']:.2f})",
            pfc["p99"] >= 1.25 * quiet["p99"],
        ),
        (
            f"DCQCN shrinks it: the slowest tenth x{both['tail'] / pfc['tail']:.2f} and the time "
            f"lost x{both['lost'] / pfc['lost']:.2f} of PFC alone",
            both["tail"] < pfc["tail"] and both["lost"] < pfc["lost"],
        ),
    ]
    check, ok = check_lines(checks)
    if algo != "ring":
        lines.insert(0, f"all-reduce schedule: {algo} (more than {FLAT_RING_RANKS} ranks)")
    return rows, lines + check, ok


@plotted
def plot(plt: Any, rows: list[dict[str, Any]]) -> Any:
    """Iteration time against iteration end, per setting, burst periods shaded."""
    fig, ax = plt.subplots(figsize=(9, 3.6))
    for row in rows:
        ends = np.cumsum(row["times"]) * 1e6
        ax.plot(ends, [t * 1e6 for t in row["times"]], marker=".", label=row["setting"])
    for b in range(BURSTS):
        start = (50e-6 + b * PERIOD) * 1e6
        ax.axvspan(start, start + 6 * BURST * 8 / 100e9 * 1e6, color="red", alpha=0.08, lw=0)
    ax.set_xlabel("time (emulated us); shaded: a burst's drain time at the receiver's port")
    ax.set_ylabel("all-reduce iteration (us)")
    ranks, size = rows[0]["ranks"], rows[0]["bytes"]
    what = "ring" if schedule(ranks) == "ring" else "tuned"
    ax.set_title(f"straggler: {ranks}-rank {what} all-reduce, {size >> 10} KiB, beside bursts")
    ax.legend(fontsize=8)
    return fig


def register() -> None:
    """Add ``straggler`` to ``rocev2-emu scenario`` (virtual time only)."""
    scale = frozenset({"topology", "iterations", "size"})

    def job(seed: int, _tdf: float | None, mode: harness.Mode) -> harness.Rows:
        return straggler(seed, mode)  # virtual time only: no TDF

    harness.register(harness.job_scenario("straggler", job, plot, takes=scale, virtual_only=True))
