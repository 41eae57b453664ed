"""Flow-size workloads at a target load, as data-center transport papers run them: flows
whose sizes are drawn from a published distribution, arriving as a Poisson process sized so
that the hosts' links carry ``load`` of their line rate on average, between random pairs of
hosts (the HPCC simulator's ``traffic_gen`` does the same).

A distribution is a CDF: points (size in bytes, cumulative probability) rising to 1, sizes
drawn by inverse transform with linear interpolation between points.  Shipped:
:data:`WEB_SEARCH`, the web-search workload of the DCTCP paper (Alizadeh et al., SIGCOMM 2010,
Fig. 4), and :data:`HADOOP`, Facebook's Hadoop cluster (Roy et al., "Inside the Social
Network's (Datacenter) Network", SIGCOMM 2015), both in the points the HPCC paper's simulator
uses (its ``traffic_gen``).  Any other comes from a file of
``size cdf`` lines (``--cdf FILE``).  The flows are generated one at a time
(:func:`poisson_flows`): a workload of 100 000 flows holds one flow, not 100 000.
"""

from __future__ import annotations

import bisect
import itertools
import math
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Final, TextIO

from rocev2_emu.fabric.agent import FlowSpec
from rocev2_emu.topology.model import Topology, TopologyError

Cdf = tuple[tuple[float, float], ...]

WEB_SEARCH: Final[Cdf] = (  # DCTCP's web search (Fig. 4), bytes, as HPCC's traffic_gen has it
    (0, 0.0),
    (10_000, 0.15),
    (20_000, 0.2),
    (30_000, 0.3),
    (50_000, 0.4),
    (80_000, 0.53),
    (200_000, 0.6),
    (1_000_000, 0.7),
    (2_000_000, 0.8),
    (5_000_000, 0.9),
    (10_000_000, 0.97),
    (30_000_000, 1.0),
)
HADOOP: Final[Cdf] = (  # Facebook's Hadoop cluster (Roy et al., SIGCOMM 2015), bytes, as
    (0, 0.0),  # the HPCC simulator's traffic_gen/FbHdp_distribution.txt has it
    (100, 0.01),
    (200, 0.02),
    (300, 0.05),
    (350, 0.15),
    (400, 0.2),
    (500, 0.3),
    (600, 0.4),
    (700, 0.5),
    (1_000, 0.6),
    (2_000, 0.67),
    (7_000, 0.7),
    (30_000, 0.72),
    (50_000, 0.82),
    (80_000, 0.87),
    (120_000, 0.9),
    (300_000, 0.95),
    (1_000_000, 0.975),
    (2_000_000, 0.99),
    (10_000_000, 1.0),
)
CDFS: Final = {"websearch": WEB_SEARCH, "hadoop": HADOOP}


def load_cdf(name: str) -> Cdf:
    """A shipped CDF by name, or a file of ``size cdf`` lines (``#`` starts a comment); an
    error names the line that is not a CDF."""
    if name in CDFS:
        return CDFS[name]
    try:
        text = Path(name).read_text()
    except OSError as exc:
        raise TopologyError(f"--cdf {name}: neither {', '.join(CDFS)} nor a readable file") from exc
    points: list[tuple[float, float]] = []
    for n, line in enumerate(text.splitlines(), 1):
        fields = line.split("#")[0].split()
        if not fields:
            continue
        try:
            size, cum = float(fields[0]), float(fields[1])
        except (ValueError, IndexError):
            raise TopologyError(f"{name}:{n}: {line!r} is not 'size cdf'") from None
        points.append((size, cum))
    return check_cdf(tuple(points), name)


def check_cdf(cdf: Cdf, where: str) -> Cdf:
    """``cdf`` if sizes and probabilities never fall, start >= 0 and end at probability 1."""
    if len(cdf) < 2 or cdf[0][0] < 0 or not math.isclose(cdf[-1][1], 1.0):
        raise TopologyError(f"{where}: a CDF needs two points or more, sizes >= 0, ending at 1")
    for (s0, c0), (s1, c1) in itertools.pairwise(cdf):
        if s1 < s0 or c1 < c0 or not 0 <= c0 <= 1:
            raise TopologyError(f"{where}: ({s1:g}, {c1:g}) falls below ({s0:g}, {c0:g})")
    return cdf


def mean_size(cdf: Cdf) -> float:
    """The distribution's mean, bytes (linear between points, as sizes are drawn)."""
    return sum((s0 + s1) / 2 * (c1 - c0) for (s0, c0), (s1, c1) in itertools.pairwise(cdf))


def draw(cdf: Cdf, u: float) -> int:
    """The size at cumulative probability ``u`` (0 <= u < 1), at least one byte."""
    probs = [c for _, c in cdf]
    i = max(1, bisect.bisect_left(probs, u))
    (s0, c0), (s1, c1) = cdf[i - 1], cdf[min(i, len(cdf) - 1)]
    size = s0 if c1 == c0 else s0 + (s1 - s0) * (u - c0) / (c1 - c0)
    return max(1, round(size))


def poisson_flows(
    topo: Topology,
    cdf: Cdf,
    load: float,
    *,
    count: int,
    seed: int = 1,
    start: float = 0.0,
) -> Iterator[FlowSpec]:
    """``count`` flows, one at a time: Poisson arrivals at the rate that puts ``load`` of the
    hosts' line rate on their links (rate = load x hosts x link rate / 8 / mean size), each
    between two distinct random hosts, its size drawn from ``cdf``; ``start``: the first
    arrival's earliest time (emulated s).  Seeded: the same flows for a seed."""
    if not 0 < load <= 1:
        raise TopologyError(f"--load {load:g}: a fraction of the line rate, in (0, 1]")
    hosts = [h.name for h in topo.hosts]
    if len(hosts) < 2:
        raise TopologyError(f"{topo.path}: a workload needs two hosts or more")
    rate_bps = min(topo.host_link(h)[0].rate_bps for h in hosts) or 100e9
    per_second = load * len(hosts) * rate_bps / 8 / mean_size(cdf)
    rng = random.Random(seed)
    t = start
    for i in range(count):
        t += rng.expovariate(per_second)
        src, dst = rng.sample(hosts, 2)
        yield FlowSpec(i, src, dst, draw(cdf, rng.random()), t)


def write_flows(flows: Iterator[FlowSpec], out: TextIO, header: str) -> int:
    """The flows as a flow list (``up --flows``), written as they come; how many."""
    out.write(f"# {header}\n")
    n = 0
    for f in flows:
        out.write(
            f'\n[[flow]]\nsrc = "{f.src}"\ndst = "{f.dst}"\nsize = {f.size}\n'
            f"start_us = {f.start * 1e6:.3f}\n"
        )
        n += 1
    return n
