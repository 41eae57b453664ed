"""``rocev2-emu workload``: a flow list drawn from a flow-size distribution at a target load
(:mod:`rocev2_emu.fabric.workload`), for ``up --flows`` - whose report then gives each flow's
FCT slowdown and the summary by size (:mod:`rocev2_emu.fabric.slowdown`)."""

from __future__ import annotations

import argparse
import sys
from contextlib import ExitStack

from rocev2_emu.cli.args import positive_int
from rocev2_emu.cli.commands import Command, register
from rocev2_emu.fabric import workload
from rocev2_emu.topology.file import load


def _configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("topology", help="topology TOML file: its hosts send and receive")
    p.add_argument(
        "--cdf",
        default="websearch",
        help=f"flow sizes: {', '.join(workload.CDFS)} (DCTCP's web search; Facebook's Hadoop "
        "cluster, SIGCOMM 2015: HPCC's points, in bytes), or a file of 'size cdf' lines "
        "(default websearch)",
    )
    p.add_argument(
        "--load",
        type=float,
        default=0.3,
        help="the hosts' links' average load, a fraction of their line rate (default 0.3)",
    )
    p.add_argument("--flows", type=positive_int, default=1000, help="how many (default 1000)")
    p.add_argument("--seed", type=int, default=1, help="arrivals, pairs and sizes (default 1)")
    p.add_argument("--out", help="write the flow list here (default: standard output)")


def _run(args: argparse.Namespace) -> int:
    topo = load(args.topology)
    cdf = workload.load_cdf(args.cdf)
    flows = workload.poisson_flows(topo, cdf, args.load, count=args.flows, seed=args.seed)
    mean = workload.mean_size(cdf)
    header = (
        f"rocev2-emu workload {args.topology} --cdf {args.cdf} --load {args.load:g} --flows "
        f"{args.flows} --seed {args.seed}: Poisson arrivals, random pairs, mean size {mean:.0f} B"
    )
    with ExitStack() as stack:
        out = stack.enter_context(open(args.out, "w")) if args.out else sys.stdout
        n = workload.write_flows(flows, out, header)
    if args.out:
        print(f"# {n} flows in {args.out}: rocev2-emu up {args.topology} --flows {args.out}")
    return 0


register(
    Command(
        "workload",
        "draw flows from a flow-size distribution at a target load (a flow list for up --flows)",
        _configure,
        _run,
    )
)
