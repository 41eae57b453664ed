"""``rocev2-emu bench virtual``: how fast virtual time runs, in frame-hops per second of wall
time (a frame crossing one link is one hop), and in how much memory.

The cases (issue #12's yardsticks):

- ``a``: the 8-rank 4 MiB ring all-reduce on the shipped leaf-spine;
- ``b``: a k = 8 fat-tree (128 hosts, 80 switches), 128 ranks, a 1 MiB ring all-reduce;
- ``c-pfc`` / ``c-dcqcn``: a 1023 -> 1 incast on a k = 16 fat-tree (1 024 hosts,
  320 switches), 64 KiB per sender, PFC on, without and with DCQCN.

Each case runs in a fresh Python process (``python -m collectives.bench.virtual CASE``) so its
peak resident memory is its own; the wall time counts building the fabric (every NIC, switch,
QP connection) and the run, not the interpreter's start.
"""

from __future__ import annotations

import argparse
import json
import math
import resource
import subprocess
import sys
import time
import tomllib
from collections.abc import Callable
from typing import Any, Final

import numpy as np

from collectives.comm.communicator import Communicator
from collectives.jobs.job import run_virtual
from collectives.jobs.registry import job
from rocev2_emu import cores
from rocev2_emu.fabric.agent import FlowSpec
from rocev2_emu.fabric.virtual import run_flows_virtual
from rocev2_emu.topology.file import parse
from rocev2_emu.topology.generate import fat_tree, leaf_spine
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


def _topology(text: str, *, dcqcn: bool | None = None) -> Topology:
    data = tomllib.loads(text)
    if dcqcn is not None:
        data["dcqcn"]["enabled"] = dcqcn
        data["ecn"]["enabled"] = dcqcn
    return parse(data, "<bench virtual>")


def _all_reduce(text: str, nbytes: int) -> Callable[[], tuple[dict[str, Any], float]]:
    def run() -> tuple[dict[str, Any], float]:
        results, fabric = run_virtual(_topology(text), "all-reduce-once", {"bytes": nbytes})
        return fabric, max(results.values())

    return run


def _incast(dcqcn: bool) -> Callable[[], tuple[dict[str, Any], float]]:
    def run() -> tuple[dict[str, Any], float]:
        topo = _topology(fat_tree(16), dcqcn=dcqcn)
        hosts = [h.name for h in topo.hosts]
        flows = [FlowSpec(i, src, hosts[-1], 64 << 10) for i, src in enumerate(hosts[:-1])]
        results, fabric = run_flows_virtual(topo, flows)
        if not all(r.verified for r in results):
            raise AssertionError("a flow of the incast did not arrive intact")
        return fabric, max(r.fct for r in results)

    return run


RUNS: Final[dict[str, Callable[[], Callable[[], tuple[dict[str, Any], float]]]]] = {
    "a": lambda: _all_reduce(leaf_spine(2, 4, 2), 4 << 20),
    "b": lambda: _all_reduce(fat_tree(8), 1 << 20),
    "c-pfc": lambda: _incast(False),
    "c-dcqcn": lambda: _incast(True),
}


def measure(case: str) -> dict[str, Any]:
    """Run one case in this process: its frame-hops, wall seconds, emulated seconds, memory."""
    run = RUNS[case]()
    start = time.perf_counter()
    fabric, emulated = run()
    wall = time.perf_counter() - start
    return {
        "case": case,
        "hops": fabric["frame_hops"],
        "wall_s": wall,
        "emulated_s": emulated,
        "peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "pfc_frames": fabric["pfc_tx"],
        "drops": sum(fabric["drops"].values()),
    }


def main(cases: list[str], timeout: float = 3600.0) -> int:
    """Each case in its own process; print one line per case."""
    print("# rocev2-emu bench virtual: frame-hops per second of wall time (one core)")
    print(f"# {cores.describe()}")
    print(
        f"# {'case':8} {'frame-hops':>11} {'wall s':>8} {'hops/s':>9} {'peak MiB':>9} "
        f"{'emulated us':>12}  what"
    )
    failed = 0
    for case in cases:
        proc = subprocess.run(
            [sys.executable, "-m", "collectives.bench.virtual", case],
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
        print(
            f"  {case:8} {r['hops']:>11,} {r['wall_s']:>8.1f} {rate:>9,.0f} "
            f"{r['peak_mib']:>9,.0f} {r['emulated_s'] * 1e6:>12,.1f}  {CASES[case]}",
            flush=True,
        )
    return 1 if failed else 0


def _child() -> int:
    p = argparse.ArgumentParser(prog="python -m collectives.bench.virtual")
    p.add_argument("case", choices=list(RUNS))
    args = p.parse_args()
    print(json.dumps(measure(args.case)))
    return 0


if __name__ == "__main__":
    sys.exit(_child())
