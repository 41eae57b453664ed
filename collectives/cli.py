"""``rocev2-emu bench all-reduce | all-gather | reduce-scatter | broadcast | all-to-all |
sendrecv``: nccl-tests' flags,
and the all-reduce demo (registered with the CLI by :mod:`collectives.plugin`).

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
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, fields
from functools import partial
from pathlib import Path

from collectives.bench import nccl as bench
from collectives.bench import virtual as virtual_bench
from collectives.comm import ops
from collectives.comm.communicator import ALGORITHMS
from collectives.jobs.failures import failures
from collectives.jobs.launch import run_attached, run_job
from rocev2_emu.cli.args import (
    add_run_options,
    host_port,
    nonnegative_int,
    positive_int,
    run_options,
    with_payload,
)
from rocev2_emu.cli.bench import BenchKind, register_bench
from rocev2_emu.cli.demo import set_demo
from rocev2_emu.fabric import blocks
from rocev2_emu.fabric.flow_run import describe
from rocev2_emu.fabric.layout import process_layout
from rocev2_emu.fabric.options import Clock, RunOptions
from rocev2_emu.topology.file import load, parse, resolve_names
from rocev2_emu.topology.generate import leaf_spine
from rocev2_emu.topology.model import NodeKind, Topology

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
    g.add_argument("-f", "--stepfactor", type=positive_int, default=4, help="size multiplier (4)")
    g.add_argument(
        "-n", "--iters", type=positive_int, default=5, help="timed iterations per size (5)"
    )
    g.add_argument(
        "-w", "--warmup_iters", type=nonnegative_int, default=1, help="warm-up iterations (1)"
    )
    g.add_argument("-c", "--check", type=int, default=1, help="check results (1) or not (0)")
    g.add_argument("-o", "--op", default="sum", choices=list(ops.OPS), help="reduction (sum)")
    g.add_argument("-d", "--datatype", default="float", choices=list(ops.DTYPES), help="(float)")
    g.add_argument("-r", "--root", type=int, default=0, help="broadcast root (0)")
    g.add_argument(
        "--algo",
        default="auto",
        choices=ALGORITHMS,
        help="the all-reduce's schedule: a ring, the hierarchical rings, a double binary tree "
        "over the servers (their fabric inside them), or auto: chosen by the cost model per "
        "size and scale (auto)",
    )
    g.add_argument("--order", default="topology", choices=["topology", "rank"], help="ring order")
    g.add_argument(
        "--qps-per-connection",
        type=positive_int,
        default=1,
        help="RC QPs each link stripes its chunks over, each its own ECMP flow "
        "(NCCL_IB_QPS_PER_CONNECTION; 1)",
    )
    g.add_argument(
        "--grant-dscp",
        type=int,
        choices=range(64),
        metavar="DSCP",
        help="send the receivers' clear-to-send grants (the slot credits) on a QP of their own "
        "at this DSCP, e.g. 48 (priority 6) above the data's 26 (default: with the data)",
    )
    g.add_argument(
        "--slots",
        type=positive_int,
        default=4,
        help="receive slots per link: the chunks a receiver grants at once (4)",
    )
    g.add_argument(
        "--slot-bytes",
        type=size_arg,
        default=size_arg("256K"),
        help="bytes per slot, a chunk (256K; NCCL_BUFFSIZE is slots x this); the window a "
        "receiver admits per link is slots x slot bytes",
    )
    g.add_argument("--topology", help="topology file (default: the shipped leaf-spine)")
    g.add_argument(
        "--attach",
        action="store_true",
        help="run on a fabric already running (rocev2-emu up FILE, the compose testbed); "
        "give its FILE as --topology",
    )
    add_run_options(
        g,
        None,
        "default: exact, wall with --attach (a fabric left running)",
        workers="with --clock exact (or --virtual; bench virtual too): N processes, each "
        "hosting a group of nodes (a switch with its hosts), instead of one per node (or one "
        "in all) - the same figures; with --attach: how the attached processes group the nodes "
        "(a swarm stack's worker services)",
    )
    g.add_argument(
        "--sync",
        type=host_port,
        metavar="HOST:PORT",
        help="with --clock exact --attach: serve the run's coordinator here, where its node "
        "processes (rocev2-emu node ... --clock exact --sync HOST:PORT: the compose testbed's "
        "containers) join it",
    )
    g.add_argument(
        "--ui",
        nargs="?",
        const="127.0.0.1:8080",
        metavar="ADDR:PORT",
        help="with processes: the fabric's live map while the benchmark runs (docs/ui.md)",
    )
    ignored = p.add_argument_group(
        "nccl-tests flags accepted and ignored (ranks come from the topology)"
    )
    ignored.add_argument(
        "-g", "--ngpus", type=int, help="GPUs per thread: one rank is one emulated rank"
    )
    ignored.add_argument("-t", "--nthreads", type=int, help="threads per process")
    ignored.add_argument("-z", "--blocking", type=int, help="blocking collectives (always)")


def default_topology() -> tuple[Topology, str]:
    text = leaf_spine(2, 4, 2)
    path = Path(tempfile.mkdtemp(prefix="rocev2-emu-")) / "leaf-spine.toml"
    path.write_text(text)
    return parse(tomllib.loads(text), str(path)), str(path)


@dataclass(frozen=True, slots=True)
class BenchOptions:
    """A collective benchmark run: nccl-tests' flags and where it runs."""

    minbytes: int = 8
    maxbytes: int = 1 << 20
    stepfactor: int = 4
    iters: int = 5
    warmup_iters: int = 1
    check: int = 1
    op: str = "sum"
    datatype: str = "float"
    root: int = 0
    algo: str = "auto"
    order: str = "topology"
    qps_per_connection: int = 1
    grant_dscp: int | None = None
    slots: int = 4
    slot_bytes: int = 256 << 10
    topology: str | None = None
    attach: bool = False
    run: RunOptions = field(default_factory=RunOptions)  # exact (wall with --attach: the flags)
    sync: tuple[str, int] | None = None  # --clock exact --attach: where the coordinator listens
    show_nodes: bool = False  # list the node processes and their metrics first
    ui: str | None = None  # serve the live map here while it runs (processes)

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> BenchOptions:
        given = {
            f.name: getattr(args, f.name)
            for f in fields(cls)
            if f.name != "run" and hasattr(args, f.name)  # (args.run: the command's)
        }
        return cls(**given, run=run_options(args, job=not args.attach))


def demo(options: RunOptions, ui: str | None = None) -> int:
    """The README's first command: all-reduce on the shipped leaf-spine, one process per node
    (the options' ``workers``: that many processes hosting them; ``ui``: with the fabric's
    live map)."""
    workers = options.workers
    opts = BenchOptions(
        minbytes=1 << 10,
        maxbytes=4 << 20,
        iters=2,
        algo="ring",
        run=options,
        show_nodes=True,
        ui=ui,
    )
    where = (
        "every switch and host a process on 127.10.x.y"
        if workers is None
        else f"the 14 switches and hosts in at most {workers} processes, each at its 127.10.x.y"
    )
    print(
        "rocev2-emu demo: ring all-reduce across the shipped leaf-spine (2 spines, 4 leaves, "
        f"8 hosts): {where}, real RoCEv2 frames over "
        "VXLAN links.  Each node serves Prometheus metrics at http://<its address>:9100/metrics "
        "while the demo runs (the list follows); `rocev2-emu up` keeps a fabric running.\n"
    )
    return main("all-reduce", opts)


def main(which: str, args: BenchOptions) -> int:
    coll = {"sendrecv": "send_recv"}.get(which, which.replace("-", "_"))
    if args.attach and not args.topology:  # the default is a fresh file no fabric runs from
        raise ValueError(
            "--attach needs --topology FILE: the file the running fabric was started from "
            "(rocev2-emu up FILE), whose secret lets the bench's ranks join it"
        )
    topo, path = (load(args.topology), args.topology) if args.topology else default_topology()
    # (a swarm testbed names its nodes; an attached bench finds the block its fabric took)
    options = args.run
    topo = with_payload(blocks.running(resolve_names(topo), path), options.payload)
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
        qps_per_connection=args.qps_per_connection,
        slots=args.slots,
        slot_bytes=args.slot_bytes,
        **({"grant_dscp": args.grant_dscp} if args.grant_dscp is not None else {}),
    )
    ranks = sum(h.ranks for h in topo.hosts)
    exact = options.clock is Clock.EXACT
    if exact and args.attach and not args.sync:
        raise ValueError(
            "--clock exact --attach needs --sync HOST:PORT: where this run serves its "
            "coordinator, which the nodes (rocev2-emu node ... --clock exact --sync) join"
        )
    if args.sync and not (exact and args.attach):
        raise ValueError("--sync serves the coordinator of --clock exact --attach: give both")
    mode = describe(topo, options)
    if args.attach:
        mode = f"attached to the running fabric, TDF {topo.tdf:g}"
        if exact and args.sync is not None:
            host, port = args.sync
            served = f"{host}:{port}"
            if host in ("0.0.0.0", "::", ""):  # every address of this machine (a stack's job)
                served = f"port {port} of this machine"
            paced = f", paced at {options.pace:g} wall s per emulated s" if options.pace else ""
            where = f"{process_layout(topo, options.workers)} joining {served}"
            mode = f"attached: {where}, clock: exact{paced}"
    print(
        f"# rocev2-emu bench {which}: {topo.name} ({len(topo.switches)} switches, "
        f"{len(topo.hosts)} hosts, {ranks} ranks), {mode}"
    )
    print(
        f"# minBytes {args.minbytes} maxBytes {args.maxbytes} step: {args.stepfactor}(factor) "
        f"warmup iters: {args.warmup_iters} iters: {args.iters} validation: {args.check} "
        f"algo: {args.algo} order: {args.order} qps per connection: {args.qps_per_connection}"
        f"{'; payload: none (timing only)' if topo.timing_only else ''}; times in emulated us"
    )
    if args.ui and (options.clock is Clock.VIRTUAL or args.attach):
        raise ValueError("--ui runs beside the benchmark's own processes (not --virtual, --attach)")
    if args.attach:
        run = run_attached(topo, "bench", params, options, args.sync)
    else:
        beside = map_task(topo, args.ui)
        run = run_job(
            topo, path, "bench", params, options, quiet=not args.show_nodes, beside=beside
        )
    results, fabric, synced = run.results, run.fabric, run.synced
    failed = {r: v["error"] for r, v in results.items() if isinstance(v, dict) and "error" in v}
    if failed or len(results) != ranks:
        for line in failures(failed):
            print(f"# {line}", file=sys.stderr)
        print(f"# {len(failed)} of {ranks} ranks failed", file=sys.stderr)
        return 1
    lines, wrong = bench.table(coll, params, results)
    print("#")
    upper = {  # switches with no host below them: spines, aggregation, cores
        s.name
        for s in topo.switches
        if all(topo.nodes[p].kind is NodeKind.SWITCH for _, p in s.ports)
    }
    for line in lines + bench.fabric_summary(fabric, upper):
        print(line)
    if exact:
        print(f"# clock: exact, {synced}", file=sys.stderr)
    tdf = topo.tdf if args.attach else options.dilation(topo.tdf)
    warning = bench.faithfulness_warning(fabric, tdf)
    if warning:
        print(warning, file=sys.stderr)
    return 1 if wrong else 0


def map_task(topo: Topology, ui: str | None) -> Callable[..., Awaitable[None]] | None:
    """The live map's server for ``--ui ADDR:PORT`` (None: no map)."""
    if not ui:
        return None
    from rocev2_emu.ui.server import parse_addr, serve_live  # the ui extra

    return partial(serve_live, topo, parse_addr(ui))


COLLECTIVE_BENCHES = [
    "all-reduce",
    "all-gather",
    "reduce-scatter",
    "broadcast",
    "all-to-all",
    "sendrecv",
]


def _run_bench(which: str, args: argparse.Namespace) -> int:
    given = [f for f in ("ngpus", "nthreads", "blocking") if getattr(args, f, None) is not None]
    if given:
        flags = ", ".join("--" + f for f in given)
        print(
            f"# note: {flags} accepted and ignored: ranks come from the topology", file=sys.stderr
        )
    if args.minbytes > args.maxbytes:
        raise ValueError(f"-b {args.minbytes} is larger than -e {args.maxbytes}: no size to run")
    return main(which, BenchOptions.from_args(args))


def _cases_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--cases",
        type=lambda s: [c for c in s.split(",") if c],
        default=list(virtual_bench.CASES),
        help="bench virtual: comma-separated cases "
        f"({', '.join(virtual_bench.CASES)}; default all)",
    )


def _run_cases(which: str, args: argparse.Namespace) -> int:
    unknown = sorted(set(args.cases) - set(virtual_bench.CASES))
    if unknown:
        raise ValueError(
            f"unknown bench virtual cases {unknown} (known: {list(virtual_bench.CASES)})"
        )
    return virtual_bench.main(args.cases, workers=args.workers)


def register() -> None:
    """Add the collective benchmarks and ``bench virtual`` to ``rocev2-emu bench`` and make the
    all-reduce the demo."""
    register_bench(COLLECTIVE_BENCHES, BenchKind(_run_bench, add_arguments))
    register_bench(["virtual"], BenchKind(_run_cases, _cases_arguments))
    set_demo(demo)
