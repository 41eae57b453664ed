"""``rocev2-emu scenario NAME``: a canonical congestion experiment, run and checked
(:mod:`rocev2_emu.experiments`)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

from rocev2_emu.cli.args import add_run_options, loads, positive_int, run_options
from rocev2_emu.cli.commands import Command, register
from rocev2_emu.experiments import harness
from rocev2_emu.experiments.catalog import SCENARIOS
from rocev2_emu.experiments.harness import Recorder
from rocev2_emu.fabric.options import Clock
from rocev2_emu.fabric.virtual import Watcher
from rocev2_emu.topology.model import Topology


def _configure(p: argparse.ArgumentParser) -> None:
    names = list(SCENARIOS)
    p.add_argument("name", help=f"{', '.join(names[:-1])} or {names[-1]} (docs/scenarios.md)")
    p.add_argument("--seed", type=int, default=1, help="seed (default 1)")
    p.add_argument(
        "--seeds",
        type=positive_int,
        default=1,
        metavar="N",
        help="run N seeds from --seed (each into OUT/seed-K) and say how many each check "
        "passed with (default 1)",
    )
    p.add_argument("--out", help="directory for NAME.json and NAME.png (default .)")
    add_run_options(
        p,
        None,
        "wall is dilated by --tdf (default: exact, wall for dilation)",
        tdf=f"the wall clock's time-dilation factor (default {harness.SCENARIO_TDF:g})",
        workers="with --clock exact: N processes, each hosting a group of nodes (a switch with "
        "its hosts), instead of one per node - the same results",
        pace=False,
    )
    p.add_argument(
        "--ui",
        nargs="?",
        const="127.0.0.1:8080",
        metavar="ADDR:PORT",
        help="with processes: the fabric's live map beside each run (docs/ui.md)",
    )
    p.add_argument(
        "--no-record",
        action="store_true",
        help="in virtual time, do not record each run (flows or a job) for the map's replay "
        "(default: NAME-SETTING.jsonl beside NAME.json; rocev2-emu view FILE)",
    )
    scale = p.add_argument_group("scale (each scenario takes those its help names)")
    scale.add_argument(
        "--senders", type=positive_int, help="incast: senders (default 8; processes: 4)"
    )
    scale.add_argument(
        "--size",
        type=positive_int,
        help="incast: bytes per sender (default 4 MiB); straggler: bytes per all-reduce "
        "(default 256 KiB); ecmp-entropy: the all-reduce's bytes per rank, the all-to-all's an "
        "eighth (default 8 MiB; processes: 2 MiB); spine-failure: bytes per all-reduce "
        "(default 4 MiB; processes: 1 MiB)",
    )
    scale.add_argument(
        "--topology",
        help="topology file to run on, e.g. from 'rocev2-emu topology fat-tree -k 8'; incast: "
        "its first N hosts send to its last (default: one switch); straggler: its hosts the "
        "ranks, the bursts' hosts added (default: the shipped leaf-spine); fct: its hosts send "
        "and receive (default: the shipped leaf-spine)",
    )
    scale.add_argument(
        "--iterations",
        type=positive_int,
        help="straggler: all-reduces per setting (default 40); recommendation: training steps "
        "per setting (default 3); admission: runs of each workload (default 4 all-to-alls, "
        "12 incasts; processes: 3 and 4); fct: seeds per setting and load (default 3)",
    )
    scale.add_argument("--flows", type=positive_int, help="fct: flows a run (default 200)")
    scale.add_argument(
        "--load",
        dest="loads",
        type=loads,
        help="fct: comma-separated loads, fractions of the hosts' line rate (default 0.3,0.5)",
    )
    scale.add_argument(
        "--cdf",
        help="fct: the flow-size distribution, as rocev2-emu workload's (default websearch)",
    )
    scale.add_argument(
        "--settings",
        type=lambda s: tuple(x for x in s.split(",") if x),
        help="comma-separated settings to run (incast: lossy,pfc,pfc+dcqcn,pfc+pacing; fct: "
        "pfc,dcqcn-paper,dcqcn-nvidia,dcqcn-hpcc; default all)",
    )


def _run(args: argparse.Namespace) -> int:
    scale = {k: getattr(args, k) for k in harness.SCALE}
    scenario = SCENARIOS.get(args.name)
    if args.clock is None and scenario is not None and not scenario.exact:
        args.clock = Clock.WALL  # its runs measure the wall clock (dilation)
    if args.workers is not None and (args.virtual or args.clock not in (None, Clock.EXACT)):
        print(f"{args.name} takes --workers with --clock exact only", file=sys.stderr)
        return 2  # (refused, as a scenario refuses what it does not take)
    options = run_options(args, job=True)
    if args.ui and options.clock is Clock.VIRTUAL:
        raise ValueError("--ui needs processes: a virtual run is replayed (rocev2-emu view)")
    run: dict[str, Any] = {"out": args.out, "options": options, "scale": scale}
    if args.seeds > 1:
        # a recording per seed is what --seeds 1 is for
        return harness.main_seeds(
            args.name, seed=args.seed, seeds=args.seeds, record=None, ui=None, **run
        )
    return harness.main(
        args.name,
        seed=args.seed,
        # every run in virtual time is recorded (dilation's reference run too, with processes)
        record=None if args.no_record else _recorder(args),
        ui=_live(args.ui) if args.ui else None,
        **run,
    )


def _recorder(args: argparse.Namespace) -> Recorder:
    """Each virtual run's recording (a flow run's or a collective job's), beside the
    scenario's JSON."""
    from rocev2_emu.ui.record import period_for, recorder

    out = Path(args.out or ".")

    def make(topo: Topology, setting: str, registry: CollectorRegistry | None = None) -> Watcher:
        out.mkdir(parents=True, exist_ok=True)
        safe = "".join(c if c.isalnum() or c in "+-." else "_" for c in setting)
        path = out / f"{args.name}-{safe}.jsonl"
        every = period_for(topo) * 1e6
        print(
            f"# recording {setting} in {path}, a sample every {every:.0f} us "
            f"(rocev2-emu view {path})",
            flush=True,
        )
        return recorder(topo, str(path), registry=registry)

    return make


def _live(addr: str) -> Callable[[Topology], Callable[..., Awaitable[None]]]:
    from rocev2_emu.ui.server import parse_addr, serve_live

    where = parse_addr(addr)
    return lambda topo: partial(serve_live, topo, where)


register(
    Command("scenario", "run a canonical congestion experiment and check it", _configure, _run)
)
