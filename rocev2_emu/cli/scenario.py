"""``rocev2-emu scenario NAME``: a canonical congestion experiment, run and checked
(:mod:`rocev2_emu.experiments`)."""

from __future__ import annotations

import argparse

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


def _run(args: argparse.Namespace) -> int:
    return harness.main(args.name, seed=args.seed, out=args.out, virtual=args.virtual, tdf=args.tdf)


register(
    Command("scenario", "run a canonical congestion experiment and check it", _configure, _run)
)
