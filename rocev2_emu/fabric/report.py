"""The fabric's numbers: every node's counters merged into one summary, and the flow report
``rocev2-emu up`` prints (completion times, then pauses, marks, drops and retransmissions).

Every figure is emulated; the report names the TDF it ran at and warns when the run was not
faithful (late wake-ups, datagrams the kernel dropped).
"""

from __future__ import annotations

import json
import statistics
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

from rocev2_emu.fabric import slowdown
from rocev2_emu.fabric.agent import FlowResult, HostAgent, host_stats
from rocev2_emu.runtime.clock import BEHIND_MARKS, beyond_key
from rocev2_emu.stats import percentile
from rocev2_emu.topology.model import Topology
from switch.driver import EngineSwitch
from switch.node import switch_stats


def merge_stats(stats: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Fabric totals of every node's counters (``stats`` by node name), plus ``pfc_senders``:
    the nodes that sent PFC pause frames (how far a pause spread), and ``switch_tx_bytes``."""
    total: dict[str, Any] = {"drops": {}}
    total["pfc_senders"] = sorted(name for name, s in stats.items() if s.get("pfc_tx"))
    total["switch_tx_bytes"] = {name: s["tx_bytes"] for name, s in stats.items() if "tx_bytes" in s}
    total["port_tx_bytes"] = {  # per switch, per port: how the load spread over the links
        name: s["port_tx_bytes"] for name, s in stats.items() if "port_tx_bytes" in s
    }
    for s in stats.values():
        for key, value in s.items():
            if key in ("down_vnis", "switch_tx_bytes", "port_tx_bytes"):
                continue
            if key == "drops":
                for reason, n in value.items():
                    total["drops"][reason] = total["drops"].get(reason, 0) + n
            elif key.startswith("peak_"):  # a high-water mark: the fabric's is the highest
                total[key] = max(total.get(key, 0), value)
            else:
                total[key] = total.get(key, 0) + value
    return total


def stats_delta(after: dict[str, Any], before: dict[str, Any]) -> dict[str, Any]:
    """What a job added to one node's counters: ``after - before``, key by key (a fabric that
    ran before, as an attached one, reports this job's pauses, drops and retransmits only);
    merge the nodes' deltas with :func:`merge_stats`."""
    out: dict[str, Any] = {}
    for key, value in after.items():
        old = before.get(key)
        if isinstance(value, dict):
            out[key] = stats_delta(value, old if isinstance(old, dict) else {})
            if key == "drops":
                out[key] = {k: v for k, v in out[key].items() if v}
        elif key.startswith("peak_"):  # a high-water mark since the node started
            out[key] = value
        elif key == "port_tx_bytes" and isinstance(old, list) and len(old) == len(value):
            out[key] = [a - b for a, b in zip(value, old, strict=True)]
        elif isinstance(value, int | float) and not isinstance(value, bool):
            out[key] = value - (old if isinstance(old, int | float) else 0)
        else:
            out[key] = value
    return out


def lateness(fab: dict[str, Any]) -> str:
    """How far behind the late wake-ups came (emulated), to weigh them against the run's
    times; empty when none was late."""
    late = fab.get("late_wakeups", 0)
    if not late:
        return ""
    mean = fab.get("late_seconds", 0.0) / late
    beyond = [f"{fab.get(beyond_key(m), 0)} more than {m * 1e6:.0f} us" for m in BEHIND_MARKS]
    return f" ({mean * 1e6:.2f} us behind on average; {', '.join(beyond)}; emulated)"


def fabric_stats(drivers: dict[str, EngineSwitch], agents: dict[str, HostAgent]) -> dict[str, Any]:
    """The summary of an in-process fabric (virtual mode), with the engine's frame-hops (a
    frame crossing one link is one hop)."""
    stats = merge_stats(
        {name: switch_stats(d) for name, d in drivers.items()}
        | {name: host_stats(a.ctx) for name, a in agents.items()}
    )
    stats["frame_hops"] = next(iter(drivers.values())).engine.hops if drivers else 0
    return stats


def write_json(
    path: str | None, results: list[FlowResult], fabric: dict[str, Any], topo: Topology
) -> None:
    """The flows' results, the fabric's counters and the FCT slowdown (each flow's ideal FCT
    and slowdown, and the summary by size) as JSON (``up --json``), keys sorted: two runs that
    agree give the same bytes."""
    if path is None:
        return
    doc = {
        "results": [asdict(r) for r in results],
        "fabric": fabric,
        "slowdown": {
            "flows": slowdown.slowdowns(topo, results),
            "by_size": slowdown.summary(topo, results),
        },
    }
    Path(path).write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")


def report(
    topo: Topology,
    mode: str,
    results: list[FlowResult],
    fabric: dict[str, Any],
) -> int:
    """Print the flows' completion times and the fabric's counters; the exit code.  ``mode``:
    where and on which clock the flows ran, in words."""
    print(
        f"# {topo.name}: {len(topo.hosts)} hosts, {len(topo.switches)} switches, {mode}; "
        "times are emulated"
    )
    print(
        f"{'flow':>5} {'src':>8} {'dst':>8} {'bytes':>10} {'start(us)':>10} {'FCT(us)':>10} "
        f"{'Gbit/s':>8}  status"
    )
    for r in results:
        gbps = r.size * 8 / r.fct / 1e9 if r.fct else 0.0
        ok = {True: "ok, verified", None: "ok, not checked (timing only)"}.get(
            r.verified if r.status == "ok" else False, r.status
        )
        print(
            f"{r.id:>5} {r.src:>8} {r.dst:>8} {r.size:>10} {r.start * 1e6:>10.1f} "
            f"{r.fct * 1e6:>10.1f} {gbps:>8.2f}  {ok}"
        )
    fcts = sorted(r.fct for r in results if r.ok)
    if fcts:
        print(
            f"# FCT p50 {statistics.median(fcts) * 1e6:.1f} us, p99 "
            f"{percentile(fcts, 0.99) * 1e6:.1f} us, max {fcts[-1] * 1e6:.1f} us"
        )
        for line in slowdown.lines(slowdown.summary(topo, results)):
            print(line)
    drops = fabric.get("drops", {})
    print(
        f"# fabric: PFC frames sent {fabric.get('pfc_tx', 0)}, paused "
        f"{fabric.get('paused_seconds', 0.0) * 1e6:.1f} us (port-priority total), ECN marks "
        f"{fabric.get('ecn_marked', 0)}, drops {sum(drops.values())} {dict(drops) or ''}, "
        f"watchdog storms {fabric.get('storms', 0)}, late wake-ups "
        f"{fabric.get('late_wakeups', 0)}{lateness(fabric)}, socket drops "
        f"{fabric.get('socket_drops', 0)}"
    )
    print(
        f"# hosts: PFC pauses honoured {fabric.get('nic_pauses', 0)}, CNPs sent "
        f"{fabric.get('cnps_sent', 0)} and handled {fabric.get('cnps_handled', 0)}, "
        f"retransmitted packets "
        f"{fabric.get('retransmitted', 0)}, ACK timeouts {fabric.get('timeouts', 0)}, "
        f"frames dropped by NICs {fabric.get('nic_drops', 0)}"
    )
    if fabric.get("late_wakeups") or fabric.get("socket_drops"):
        print(
            "# warning: switches fell behind (late wake-ups, or frames the "
            "kernel dropped): this run was not faithful; raise the TDF",
            file=sys.stderr,
        )
    failed = [r for r in results if not r.ok]
    if failed:
        print(f"# {len(failed)} flow(s) failed", file=sys.stderr)
    return 1 if failed else 0
