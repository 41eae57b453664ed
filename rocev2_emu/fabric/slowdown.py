"""FCT slowdown: a flow's completion time over the time it would take alone on the fabric, the
figure every data-center transport paper reports (DCQCN, HPCC, Homa, Parsimon), summarised by
flow size at the median and the tail.

A flow's ideal completion time is the HPCC paper's: its bytes at the bottleneck plus the base
round trip - here its bytes on the wire (the payload, and per packet of at most the MTU its
Ethernet, IPv4, UDP, BTH and ICRC headers and the preamble, FCS and inter-frame gap) at the
slowest link of its path, plus the path's propagation there and back (the last ACK returns
before the flow completes).  The path is the routes' first equal-cost port at each switch;
every path of a Clos has the same links.  A flow the emulation completes a fraction of a
microsecond under it (its first frame's serialization overlaps the round trip) counts as 1.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any, Final

from rocev2_emu.fabric.agent import FlowResult
from rocev2_emu.stats import percentile
from rocev2_emu.topology.model import Topology
from rocev2_emu.wire.linerate import WIRE_OVERHEAD

PACKET_OVERHEAD: Final = 14 + 20 + 8 + 12 + 4 + WIRE_OVERHEAD  # Ethernet .. ICRC, on the wire
BUCKETS: Final = (  # flow sizes, bytes: [low, high)
    (0, 10_000),
    (10_000, 100_000),
    (100_000, 1_000_000),
    (1_000_000, 10_000_000),
    (10_000_000, math.inf),
)


def path_of(topo: Topology, src: str, dst: str) -> tuple[float, float]:
    """(the slowest link's rate in bit/s, the one-way propagation delay) from host ``src`` to
    host ``dst``."""
    link, node = topo.host_link(src)
    rate, delay = link.rate_bps, link.delay
    at = node.name
    for _ in range(len(topo.nodes)):  # (a path visits each node once at most)
        ports = topo.routes[at][dst]
        if not ports:
            raise ValueError(f"no route from {src} to {dst}")
        link, peer = topo.nodes[at].ports[ports[0]]
        rate = min(rate, link.rate_bps) if link.rate_bps else rate
        delay += link.delay
        if peer == dst:
            return rate, delay
        at = peer
    raise ValueError(f"no route from {src} to {dst}")


def ideal_fct(topo: Topology, src: str, dst: str, size: int) -> float:
    """Emulated seconds flow ``src`` -> ``dst`` of ``size`` bytes takes alone (the module)."""
    rate, delay = path_of(topo, src, dst)
    if not rate:
        return 2 * delay
    packets = max(1, -(-size // topo.mtu))
    return (size + packets * PACKET_OVERHEAD) * 8 / rate + 2 * delay


def slowdowns(topo: Topology, results: Iterable[FlowResult]) -> list[dict[str, Any]]:
    """Each completed flow's ideal FCT (emulated seconds) and slowdown, by id."""
    out = []
    for r in results:
        if r.status != "ok" or r.fct <= 0:
            continue
        ideal = ideal_fct(topo, r.src, r.dst, r.size)
        out.append({"id": r.id, "ideal_fct": ideal, "slowdown": max(1.0, r.fct / ideal)})
    return out


def summary(topo: Topology, results: list[FlowResult]) -> list[dict[str, Any]]:
    """Per size bucket with flows in it: the count and the slowdown's p50, p95 and p99."""
    sizes = {r.id: r.size for r in results}
    rows = []
    flows = slowdowns(topo, results)
    for low, high in BUCKETS:
        values = sorted(f["slowdown"] for f in flows if low <= sizes[f["id"]] < high)
        if values:
            rows.append(
                {
                    "bytes": [low, high if high != math.inf else None],
                    "flows": len(values),
                    "p50": percentile(values, 0.50),
                    "p95": percentile(values, 0.95),
                    "p99": percentile(values, 0.99),
                }
            )
    return rows


def lines(rows: list[dict[str, Any]]) -> list[str]:
    """The summary as the report prints it."""
    if not rows:
        return []
    out = ["# FCT slowdown (FCT / ideal FCT alone on the fabric) by flow size:"]
    for row in rows:
        out.append(
            f"#   {span(*row['bytes']):>12}  {row['flows']:>6} flows  p50 {row['p50']:7.2f}  "
            f"p95 {row['p95']:7.2f}  p99 {row['p99']:7.2f}"
        )
    return out


def span(low: float, high: float | None) -> str:
    """A size bucket as the reports name it: ``10K-100K``, ``>= 10M``."""
    return f"{_size(low)}-{_size(high)}" if high is not None else f">= {_size(low)}"


def _size(n: float) -> str:
    for unit, scale in (("M", 1_000_000), ("K", 1_000)):
        if n >= scale:
            return f"{n / scale:g}{unit}"
    return f"{n:g}"
