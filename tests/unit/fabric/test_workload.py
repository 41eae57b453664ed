"""Flow-size workloads at a target load and FCT slowdown (rocev2_emu/fabric/workload.py,
slowdown.py): the draws follow the CDF, the arrivals give the load, the flows stream, and a
flow alone on the fabric runs at its ideal."""

from __future__ import annotations

import io
import itertools
import statistics
import tomllib
from pathlib import Path

import pytest

from rocev2_emu.fabric import slowdown, workload
from rocev2_emu.fabric.agent import FlowSpec
from rocev2_emu.fabric.virtual import run_flows_virtual
from rocev2_emu.topology.file import parse
from rocev2_emu.topology.generate import leaf_spine
from rocev2_emu.topology.model import TopologyError


def _topo() -> object:
    return parse(tomllib.loads(leaf_spine(2, 4, 2)), "leaf-spine.toml")


@pytest.mark.parametrize("cdf", [workload.WEB_SEARCH, workload.HADOOP], ids=["websearch", "hadoop"])
def test_sizes_follow_the_cdf_and_arrivals_give_the_load(cdf: workload.Cdf) -> None:
    topo = _topo()
    flows = list(workload.poisson_flows(topo, cdf, 0.5, count=20_000, seed=3))  # type: ignore[arg-type]
    sizes = sorted(f.size for f in flows)
    for size, cum in cdf[1:-1]:  # the empirical CDF at each point, within 1.5 %
        assert abs(sum(1 for s in sizes if s <= size) / len(sizes) - cum) < 0.015, size
    assert abs(statistics.fmean(sizes) / workload.mean_size(cdf) - 1) < 0.05
    offered = sum(sizes) * 8 / flows[-1].start  # bits per second over the run
    assert abs(offered / (0.5 * 8 * 100e9) - 1) < 0.06  # half of 8 hosts' 100 Gbit/s
    assert all(f.src != f.dst for f in flows) and flows == sorted(flows, key=lambda f: f.start)
    again = workload.poisson_flows(topo, cdf, 0.5, count=20_000, seed=3)  # type: ignore[arg-type]
    assert list(itertools.islice(again, 5)) == flows[:5]  # seeded, and a generator


def test_a_cdf_file_is_checked_and_the_flows_are_written_as_a_flow_list(tmp_path: Path) -> None:
    good = tmp_path / "two.txt"
    good.write_text("# a two-point CDF\n1000 0\n3000 1\n")
    cdf = workload.load_cdf(str(good))
    assert workload.mean_size(cdf) == 2000 and workload.draw(cdf, 0.5) == 2000
    bad = tmp_path / "bad.txt"
    bad.write_text("1000 0.5\n500 1\n")
    with pytest.raises(TopologyError, match="falls below"):
        workload.load_cdf(str(bad))
    with pytest.raises(TopologyError, match="in \\(0, 1\\]"):
        next(workload.poisson_flows(_topo(), cdf, 1.5, count=1))  # type: ignore[arg-type]
    out = io.StringIO()
    flows = workload.poisson_flows(_topo(), cdf, 0.3, count=3)  # type: ignore[arg-type]
    assert workload.write_flows(flows, out, "test") == 3
    assert len(tomllib.loads(out.getvalue())["flow"]) == 3


def test_a_flow_alone_runs_at_its_ideal_and_shared_ones_slow_down() -> None:
    topo = _topo()
    alone = [FlowSpec(0, "h0", "h7", 1 << 20)]  # across the spines
    results, _ = run_flows_virtual(topo, alone)  # type: ignore[arg-type]
    (row,) = slowdown.slowdowns(topo, results)  # type: ignore[arg-type]
    assert 1.0 <= row["slowdown"] < 1.05  # the transport's own overheads only
    shared = [FlowSpec(i, src, "h7", 1 << 20) for i, src in enumerate(["h0", "h1", "h2", "h3"])]
    results, _ = run_flows_virtual(topo, shared)  # type: ignore[arg-type]
    (bucket,) = slowdown.summary(topo, results)  # type: ignore[arg-type]
    assert bucket["flows"] == 4 and 2.0 < bucket["p50"] < 5.0  # four flows into one link
    assert 3.5 < bucket["p99"] < 5.0  # the last ends after about the four together
    assert any("1M-10M" in line for line in slowdown.lines([bucket]))
