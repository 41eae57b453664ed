"""``rocev2-emu bench all-reduce | all-gather | reduce-scatter | broadcast``: nccl-tests' flags.

Over a topology file (default: the shipped leaf-spine, 2 spines, 4 leaves, 2 hosts per leaf,
one rank per host), as one process per node at the topology's TDF, or ``--virtual``.  Prints
nccl-tests' table, then the fabric summary; exits 1 when any value is wrong or a rank fails.
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
import tomllib
from pathlib import Path

from collectives import bench, ops
from rocev2_emu.topogen import leaf_spine
from rocev2_emu.topology import Topology, load, parse, resolve_names

_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def size_arg(text: str) -> int:
    """nccl-tests' sizes: 8, 64K, 64M, 1G."""
    m = re.fullmatch(r"(\d+)([KMG]?)B?", text.strip().upper())
    if not m:
        raise argparse.ArgumentTypeError(f"size {text!r}: a number of bytes, with K, M or G")
    return int(m.group(1)) * _UNITS[m.group(2)]


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("collective benchmarks (nccl-tests flags)")
    g.add_argument(
        "-b", "--minbytes", type=size_arg, default=size_arg("8"), help="smallest size (8)"
    )
    g.add_argument("-e", "--maxbytes", type=size_arg, default=size_arg("1M"), help="largest (1M)")
    g.add_argument("-f", "--stepfactor", type=int, default=4, help="size multiplier (4)")
    g.add_argument("-n", "--iters", type=int, default=5, help="timed iterations per size (5)")
    g.add_argument("-w", "--warmup_iters", type=int, default=1, help="warm-up iterations (1)")
    g.add_argument("-c", "--check", type=int, default=1, help="check results (1) or not (0)")
    g.add_argument("-o", "--op", default="sum", choices=list(ops.OPS), help="reduction (sum)")
    g.add_argument("-d", "--datatype", default="float", choices=list(ops.DTYPES), help="(float)")
    g.add_argument("-r", "--root", type=int, default=0, help="broadcast root (0)")
    g.add_argument("--algo", default="auto", choices=["ring", "hierarchical", "auto"])
    g.add_argument("--order", default="topology", choices=["topology", "rank"], help="ring order")
    g.add_argument("--topology", help="topology file (default: the shipped leaf-spine)")
    g.add_argument("--virtual", action="store_true", help="in virtual time, one process")
    g.add_argument(
        "--attach",
        action="store_true",
        help="run on a fabric already running (rocev2-emu up, the compose testbed)",
    )
    g.add_argument("--tdf", type=float, help="TDF with processes (default: the topology's)")


def default_topology() -> tuple[Topology, str]:
    text = leaf_spine(2, 4, 2)
    path = Path(tempfile.mkdtemp(prefix="rocev2-emu-")) / "leaf-spine.toml"
    path.write_text(text)
    return parse(tomllib.loads(text), str(path)), str(path)


def demo(tdf: float | None) -> int:
    """The README's first command: all-reduce on the shipped leaf-spine, one process per node."""
    args = argparse.Namespace(
        minbytes=1 << 10,
        maxbytes=4 << 20,
        stepfactor=4,
        iters=2,
        warmup_iters=1,
        check=1,
        op="sum",
        datatype="float",
        root=0,
        algo="auto",
        order="topology",
        topology=None,
        virtual=False,
        attach=False,
        tdf=tdf,
        show_nodes=True,
    )
    print(
        "rocev2-emu demo: ring all-reduce across the shipped leaf-spine (2 spines, 4 leaves, "
        "8 hosts): every switch and host a process on 127.10.x.y, real RoCEv2 frames over "
        "VXLAN links.  Each node serves Prometheus metrics at http://<its address>:9100/metrics "
        "while the demo runs (the list follows); `rocev2-emu up` keeps a fabric running.\n"
    )
    return main("all-reduce", args)


def main(which: str, args: argparse.Namespace) -> int:
    coll = which.replace("-", "_")
    topo, path = (load(args.topology), args.topology) if args.topology else default_topology()
    topo = resolve_names(topo)  # a swarm testbed names its nodes; resolve them once
    params = bench.params(
        bench.sizes(args.minbytes, args.maxbytes, args.stepfactor),
        coll,
        iters=args.iters,
        warmup=args.warmup_iters,
        check=bool(args.check),
        op=args.op,
        dtype=args.datatype,
        root=args.root,
        algo=args.algo,
        order=args.order,
    )
    ranks = sum(h.ranks for h in topo.hosts)
    tdf = 1.0 if args.virtual else (args.tdf or topo.tdf)
    mode = "virtual time" if args.virtual else f"one process per node, TDF {tdf:g}"
    if getattr(args, "attach", False):
        mode = f"attached to the running fabric, TDF {topo.tdf:g}"
    print(
        f"# rocev2-emu bench {which}: {topo.name} ({len(topo.switches)} switches, "
        f"{len(topo.hosts)} hosts, {ranks} ranks), {mode}"
    )
    print(
        f"# minBytes {args.minbytes} maxBytes {args.maxbytes} step: {args.stepfactor}(factor) "
        f"warmup iters: {args.warmup_iters} iters: {args.iters} validation: {args.check} "
        f"algo: {args.algo} order: {args.order}; times in emulated us"
    )
    if args.virtual:
        from collectives.job import run_virtual

        results, fabric = run_virtual(topo, "bench", params)
    elif getattr(args, "attach", False):
        from collectives.launch import run_attached

        results, fabric = run_attached(topo, "bench", params)
    else:
        from collectives.launch import run_local

        results, fabric = run_local(
            topo, path, tdf, "bench", params, quiet=not getattr(args, "show_nodes", False)
        )
    failed = {r: v["error"] for r, v in results.items() if isinstance(v, dict) and "error" in v}
    if failed or len(results) != ranks:
        for r, why in sorted(failed.items()):
            print(f"# rank {r}: {why}", file=sys.stderr)
        print(f"# {len(failed)} of {ranks} ranks failed", file=sys.stderr)
        return 1
    lines, wrong = bench.table(coll, params, results)
    print("#")
    for line in lines + bench.fabric_summary(fabric):
        print(line)
    return 1 if wrong else 0
