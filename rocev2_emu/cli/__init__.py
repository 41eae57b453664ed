"""The ``rocev2-emu`` command line.

Each command group is a module that registers its commands (:mod:`rocev2_emu.cli.commands`):
:mod:`~rocev2_emu.cli.demo` (``demo``), :mod:`~rocev2_emu.cli.perftest` (``write-bw``,
``write-lat``, ``send-bw``, ``read-bw``), :mod:`~rocev2_emu.cli.fabric` (``up``, ``node``,
``link``, ``stop``, ``view``), :mod:`~rocev2_emu.cli.files` (``topology``, ``compose``,
``secret``), :mod:`~rocev2_emu.cli.scenario` and
:mod:`~rocev2_emu.cli.bench`.  Installed plugins (the ``rocev2_emu.plugins`` entry points:
the collectives) register theirs before the parser is built.  Every figure printed is in
emulated units and states the TDF it ran at.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

from rocev2_emu import __version__, cores
from rocev2_emu.cli import bench, demo, extras, fabric, files, perftest, scenario, workload
from rocev2_emu.cli.commands import COMMANDS
from rocev2_emu.control.channel import ControlError
from rocev2_emu.fabric.services import load_plugins
from rocev2_emu.runtime.ports import BATCH_IO_ENV
from rocev2_emu.runtime.sync_messages import SyncError
from rocev2_emu.tools.perftest import PerftestError
from rocev2_emu.transport.errors import VerbsError

__all__ = [
    "bench",
    "build_parser",
    "demo",
    "fabric",
    "files",
    "main",
    "perftest",
    "scenario",
    "workload",
]

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
    "secret",
    "scenario",
    "workload",
    "bench",
]


def build_parser() -> argparse.ArgumentParser:
    load_plugins()
    parser = argparse.ArgumentParser(
        prog="rocev2-emu",
        description="A RoCEv2 fabric that really runs: software NICs "
        "speaking real RoCEv2 frames between processes.",
    )
    parser.add_argument(
        "--version",
        action="version",
        version=f"%(prog)s {__version__}, {cores.describe()}",
        help="the version, and which build of the protocol cores runs (compiled or pure)",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    parser.add_argument(
        "--no-batch-io",
        action="store_true",
        help="one datagram per system call (no UDP GSO/GRO), for this command and the node "
        "processes it starts: a live capture (tshark -i lo) then sees one frame per datagram",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    names = [n for n in _ORDER if n in COMMANDS] + [n for n in COMMANDS if n not in _ORDER]
    for name in names:
        cmd = COMMANDS[name]
        p = sub.add_parser(name, help=cmd.help, description=cmd.description)
        cmd.configure(p)
        p.set_defaults(run=cmd.run, parser=p)
    return parser


ERRORS = (PerftestError, VerbsError, ControlError, SyncError, OSError, ValueError, RuntimeError)


def _leaves(exc: BaseException) -> list[BaseException]:
    """The exceptions inside (nested) exception groups, in order."""
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for sub in exc.exceptions for leaf in _leaves(sub)]
    return [exc]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    rest: list[str] = []
    if "--" in argv:  # what follows is a program to run (``launch``), not our arguments
        cut = argv.index("--")
        argv, rest = argv[:cut], argv[cut + 1 :]
    args, unknown = build_parser().parse_known_args(argv)
    if rest and not getattr(args, "program", False):
        unknown += ["--", *rest]
    if unknown:  # the subcommand's usage, not the top level's
        args.parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    args.rest = rest
    if args.no_batch_io:
        os.environ[BATCH_IO_ENV] = "0"  # inherited by the node processes this command starts
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )
    try:
        extras.check(args)  # a flag whose extra is missing: refused before anything starts
        code: int = args.run(args)
        return code
    except (KeyboardInterrupt, *ERRORS, BaseExceptionGroup) as exc:
        # trio wraps what a task raised in exception groups: report the first real cause, in
        # one line, as a command-line tool should (tracebacks with -v)
        leaves = _leaves(exc)
        if any(isinstance(e, KeyboardInterrupt) for e in leaves):
            print(f"rocev2-emu {args.command}: interrupted", file=sys.stderr)
            return 130
        cause = next((e for e in leaves if isinstance(e, ERRORS)), None)
        if cause is None or args.verbose:
            raise
        print(f"rocev2-emu {args.command}: error: {cause}", file=sys.stderr)
        return 1
