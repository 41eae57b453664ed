"""The ``rocev2-emu`` command line.

Each command group is a module that registers its commands (:mod:`rocev2_emu.cli.commands`):
:mod:`~rocev2_emu.cli.demo` (``demo``), :mod:`~rocev2_emu.cli.perftest` (``write-bw``,
``write-lat``, ``send-bw``, ``read-bw``), :mod:`~rocev2_emu.cli.fabric` (``up``, ``node``,
``link``, ``stop``, ``topology``, ``compose``), :mod:`~rocev2_emu.cli.scenario` and
:mod:`~rocev2_emu.cli.bench`.  Installed plugins (the ``rocev2_emu.plugins`` entry points:
the collectives) register theirs before the parser is built.  Every figure printed is in
emulated units and states the TDF it ran at.
"""

from __future__ import annotations

import argparse
import logging
import sys

from rocev2_emu import __version__
from rocev2_emu.cli import bench, demo, fabric, perftest, scenario
from rocev2_emu.cli.commands import COMMANDS
from rocev2_emu.fabric.services import load_plugins
from rocev2_emu.tools.perftest import PerftestError
from rocev2_emu.transport.errors import VerbsError

__all__ = ["bench", "build_parser", "demo", "fabric", "main", "perftest", "scenario"]

_ORDER = [
    "demo",
    "write-bw",
    "write-lat",
    "send-bw",
    "read-bw",
    "up",
    "node",
    "link",
    "stop",
    "topology",
    "compose",
    "scenario",
    "bench",
]


def build_parser() -> argparse.ArgumentParser:
    load_plugins()
    parser = argparse.ArgumentParser(
        prog="rocev2-emu",
        description="A RoCEv2 fabric that really runs: software NICs "
        "speaking real RoCEv2 frames between processes.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True)
    names = [n for n in _ORDER if n in COMMANDS] + [n for n in COMMANDS if n not in _ORDER]
    for name in names:
        cmd = COMMANDS[name]
        p = sub.add_parser(name, help=cmd.help, description=cmd.description)
        cmd.configure(p)
        p.set_defaults(run=cmd.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )
    try:
        code: int = args.run(args)
        return code
    except (PerftestError, VerbsError, OSError, ValueError, RuntimeError) as exc:
        print(f"rocev2-emu {args.command}: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
