"""``rocev2-emu scenario NAME``: a canonical congestion experiment, run and checked
(:mod:`rocev2_emu.experiments`)."""

from __future__ import annotations

import argparse

from rocev2_emu.cli.args import positive_int
from rocev2_emu.cli.commands import Command, register
from rocev2_emu.experiments import harness
from rocev2_emu.experiments.catalog import SCENARIOS


def _configure(p: argparse.ArgumentParser) -> None:
    names = list(SCENARIOS)
    p.add_argument("name", help=f"{', '.join(names[:-1])} or {names[-1]} (docs/scenarios.md)")
    p.add_argument("--virtual", action="store_true", help="in virtual time (one process)")
    p.add_argument("--seed", type=int, default=1, help="seed (default 1)")
    p.add_argument("--out", help="directory for NAME.json and NAME.png (default .)")
    p.add_argument(
        "--tdf", type=float, default=1000.0, help="TDF of a run with real processes (default 1000)"
    )
    scale = p.add_argument_group("scale (incast)")
    scale.add_argument("--senders", type=positive_int, help="senders (default 8; processes: 4)")
    scale.add_argument("--size", type=positive_int, help="bytes per sender (default 4 MiB)")
    scale.add_argument(
        "--topology",
        help="topology file to run on (its first N hosts send to its last), e.g. from "
        "'rocev2-emu topology fat-tree -k 16'; default: one switch",
    )
    scale.add_argument(
        "--settings",
        type=lambda s: tuple(x for x in s.split(",") if x),
        help="comma-separated settings to run (incast: lossy,pfc,pfc+dcqcn,pfc+pacing; "
        "default all)",
    )


def _run(args: argparse.Namespace) -> int:
    scale = {k: getattr(args, k) for k in ("senders", "size", "topology", "settings")}
    return harness.main(
        args.name, seed=args.seed, out=args.out, virtual=args.virtual, tdf=args.tdf, scale=scale
    )


register(
    Command("scenario", "run a canonical congestion experiment and check it", _configure, _run)
)
