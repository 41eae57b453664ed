"""``rocev2-emu bench virtual``: how fast virtual time runs, in frame-hops per second of wall
time (a frame crossing one link is one hop), and in how much memory.

The cases (issue #12's yardsticks):

- ``a``: the 8-rank 4 MiB ring all-reduce on the shipped leaf-spine;
- ``b``: a k = 8 fat-tree (128 hosts, 80 switches), 128 ranks, a 1 MiB ring all-reduce;
- ``c-pfc`` / ``c-dcqcn``: a 1023 -> 1 incast on a k = 16 fat-tree (1 024 hosts,
  320 switches), 64 KiB per sender, PFC on, without and with DCQCN.

Each case runs in a fresh Python process (``python -m collectives.bench.virtual CASE``) so its
peak resident memory is its own; the wall time counts building the fabric (every NIC, switch,
QP connection) and the run, not the interpreter's start.  ``in engine`` divides the frame-hops by
the wall seconds the event engine spent running events alone (the cores, and the completion
handlers their hooks run: :func:`~rocev2_emu.fabric.virtual.engine_seconds`), without
building the fabric, opening flows or trio's tasks - the per-hop rate that ``hops/s`` dilutes
with set-up (``-`` with ``--workers``: the engines run in other processes).

``--workers N`` runs each case split over N processes instead (an exact run:
:func:`rocev2_emu.topology.processes.process_groups` places the nodes, a coordinator grants
windows of emulated time): the same frame-hops and emulated time, and the wall time now
counts starting the N node processes too; the peak memory is the largest process's.
"""

from __future__ import annotations

import argparse
import json
import math
import resource
import subprocess
import sys
import tempfile
import time
import tomllib
from collections.abc import Callable
from pathlib import Path
from resource import RUSAGE_CHILDREN, RUSAGE_SELF
from typing import Any, Final

import numpy as np

from collectives.comm.communicator import Communicator
from collectives.jobs.launch import run_job
from collectives.jobs.registry import job
from rocev2_emu import cores
from rocev2_emu.fabric.agent import FlowResult, FlowSpec
from rocev2_emu.fabric.flow_run import run_flow_job
from rocev2_emu.fabric.options import Clock, RunOptions
from rocev2_emu.fabric.virtual import engine_seconds
from rocev2_emu.topology.file import parse
from rocev2_emu.topology.generate import fat_tree, leaf_spine, to_toml
from rocev2_emu.topology.model import Topology

CASES: Final = {
    "a": "leaf-spine, 8 ranks, 4 MiB ring all-reduce",
    "b": "fat-tree k=8 (128 hosts, 80 switches), 128 ranks, 1 MiB ring all-reduce",
    "c-pfc": "fat-tree k=16 (1024 hosts, 320 switches), 1023 -> 1 incast, 64 KiB each, PFC",
    "c-dcqcn": "the same incast with PFC + DCQCN",
}


@job("all-reduce-once")
async def all_reduce_once(comm: Communicator, p: dict[str, Any]) -> float:
    """One ring all-reduce of ``p["bytes"]``; the emulated seconds it took on this rank."""
    x = np.ones(int(p["bytes"]) // 4, np.float32)
    await comm.barrier()
    start = comm.ctx.now()
    out = await comm.all_reduce(x, algo="ring")
    if not np.all(out == comm.size):
        raise AssertionError("the all-reduce summed wrong")
    return comm.ctx.now() - start


Run = Callable[[int | None], tuple[dict[str, Any], float]]  # workers -> counters, emulated s


def _data(text: str, dcqcn: bool | None) -> dict[str, Any]:
    data = tomllib.loads(text)
    if dcqcn is not None:
        data["dcqcn"]["enabled"] = dcqcn
        data["ecn"]["enabled"] = dcqcn
    return data


def _on(text: str, workers: int | None, dcqcn: bool | None, go: Callable[..., Any]) -> Any:
    """``go(topology, path)``: in this process (no path), or with the topology written to a
    file the ``workers`` node processes read, removed after."""
    data = _data(text, dcqcn)
    if workers is None:
        return go(parse(data, "<bench virtual>"), "")
    with tempfile.TemporaryDirectory(prefix="rocev2-emu-bench-") as tmp:
        path = Path(tmp) / "bench.toml"
        path.write_text(to_toml(data))
        return go(parse(data, str(path)), str(path))


def _all_reduce(text: str, nbytes: int) -> Run:
    name, params = "all-reduce-once", {"bytes": nbytes}

    def run(workers: int | None) -> tuple[dict[str, Any], float]:
        def on(topo: Topology, path: str) -> tuple[dict[int, Any], dict[str, Any]]:
            run = run_job(topo, path, name, params, _options(workers))
            return run.results, run.fabric

        results, fabric = _on(text, workers, None, on)
        return fabric, max(results.values())

    return run


def _options(workers: int | None) -> RunOptions:
    """One process in virtual time, or split over ``workers`` processes on the exact clock."""
    return RunOptions(Clock.VIRTUAL) if workers is None else RunOptions(workers=workers)


def _incast(dcqcn: bool) -> Run:
    def run(workers: int | None) -> tuple[dict[str, Any], float]:
        def on(topo: Topology, path: str) -> tuple[list[FlowResult], dict[str, Any]]:
            hosts = [h.name for h in topo.hosts]
            flows = [FlowSpec(i, src, hosts[-1], 64 << 10) for i, src in enumerate(hosts[:-1])]
            run = run_flow_job(topo, path, flows, _options(workers))
            return run.results, run.fabric

        results, fabric = _on(fat_tree(16), workers, dcqcn, on)
        if not all(r.ok for r in results):
            raise AssertionError("a flow of the incast did not arrive intact")
        return fabric, max(r.fct for r in results)

    return run


RUNS: Final[dict[str, Callable[[], Run]]] = {
    "a": lambda: _all_reduce(leaf_spine(2, 4, 2), 4 << 20),
    "b": lambda: _all_reduce(fat_tree(8), 1 << 20),
    "c-pfc": lambda: _incast(False),
    "c-dcqcn": lambda: _incast(True),
}


def measure(case: str, workers: int | None = None) -> dict[str, Any]:
    """Run one case in this process (``workers``: over that many node processes): its
    frame-hops, wall seconds, emulated seconds, memory (the largest process's)."""
    run = RUNS[case]()
    start, running = time.perf_counter(), engine_seconds()
    fabric, emulated = run(workers)
    wall = time.perf_counter() - start
    in_engine = engine_seconds() - running  # (0 with workers: their engines run apart)
    peak = max(resource.getrusage(who).ru_maxrss for who in (RUSAGE_SELF, RUSAGE_CHILDREN))
    return {
        "case": case,
        "hops": fabric["frame_hops"],
        "wall_s": wall,
        "engine_s": in_engine,
        "emulated_s": emulated,
        "peak_mib": peak / 1024,
        "pfc_frames": fabric["pfc_tx"],
        "drops": sum(fabric["drops"].values()),
    }


def main(cases: list[str], timeout: float = 3600.0, workers: int | None = None) -> int:
    """Each case in its own process (``workers``: split over that many); one line per case."""
    where = (
        "one process, one core"
        if workers is None
        else f"split over {workers} worker processes on the exact clock"
    )
    print(f"# rocev2-emu bench virtual: frame-hops per second of wall time ({where})")
    print(f"# {cores.describe()}")
    print(
        f"# {'case':8} {'frame-hops':>11} {'wall s':>8} {'hops/s':>9} {'in engine':>10} "
        f"{'peak MiB':>9} {'emulated us':>12}  what"
    )
    failed = 0
    for case in cases:
        proc = subprocess.run(
            [sys.executable, "-m", "collectives.bench.virtual", case]
            + ([] if workers is None else ["--workers", str(workers)]),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if proc.returncode != 0:
            failed += 1
            print(f"  {case:8} failed: {proc.stderr.strip().splitlines()[-1:]}")
            continue
        r = json.loads(proc.stdout.strip().splitlines()[-1])
        rate = r["hops"] / r["wall_s"] if r["wall_s"] > 0 else math.inf
        engine = f"{r['hops'] / r['engine_s']:,.0f}" if r["engine_s"] > 0 else "-"
        print(
            f"  {case:8} {r['hops']:>11,} {r['wall_s']:>8.1f} {rate:>9,.0f} {engine:>10} "
            f"{r['peak_mib']:>9,.0f} {r['emulated_s'] * 1e6:>12,.1f}  {CASES[case]}",
            flush=True,
        )
    return 1 if failed else 0


def _child() -> int:
    p = argparse.ArgumentParser(prog="python -m collectives.bench.virtual")
    p.add_argument("case", choices=list(RUNS))
    p.add_argument("--workers", type=int, help="split the fabric over N processes (exact)")
    args = p.parse_args()
    print(json.dumps(measure(args.case, args.workers)))
    return 0


if __name__ == "__main__":
    sys.exit(_child())
