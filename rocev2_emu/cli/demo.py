"""``rocev2-emu demo``: the README's first command.

The default demo is the one a plugin sets with :func:`set_demo` (the collectives: an all-reduce
across the shipped leaf-spine); without one, or with ``--perftest``, it is two NIC processes
running perftest's write-bw and write-lat on 127.0.0.2 and 127.0.0.3.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from collections.abc import Callable

from rocev2_emu.cli.args import add_run_options, run_options
from rocev2_emu.cli.commands import Command, register
from rocev2_emu.fabric.options import Clock, RunOptions
from rocev2_emu.tools.perftest import wait_until_listening

# the run's options (its clock, the wall clock's TDF, --pace, --workers) and --ui
Demo = Callable[[RunOptions, str | None], int]
_DEMO: list[Demo] = []


def set_demo(demo: Demo) -> None:
    """Make ``demo`` what ``rocev2-emu demo`` runs."""
    _DEMO[:] = [demo]


def _configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("--perftest", action="store_true", help="the two-NIC perftest demo instead")
    add_run_options(
        p,
        Clock.EXACT,
        virtual=False,
        tdf="time-dilation factor of --clock wall (default: the topology's; --perftest: 200)",
        workers="with --clock exact: N processes, each hosting a group of nodes (a switch with "
        "its hosts), instead of one per node - the same figures, fewer processes to wake",
        payload=False,
    )
    p.add_argument("--loss", type=float, default=0.0, help="link loss probability")
    p.add_argument(
        "--ui",
        nargs="?",
        const="127.0.0.1:8080",
        metavar="ADDR:PORT",
        help="the fabric's live map while the all-reduce demo runs (docs/ui.md)",
    )


def _run(args: argparse.Namespace) -> int:
    if args.perftest and args.ui:
        raise ValueError("--ui draws a fabric: the all-reduce demo's; --perftest has none")
    if _DEMO and not args.perftest:
        if args.tdf is not None and args.clock == Clock.EXACT:
            raise ValueError("--tdf dilates the wall clock: give --clock wall too")
        return _DEMO[0](run_options(args, job=True), args.ui)
    return perftest_demo(args.tdf or 200.0, args.loss)


def perftest_demo(tdf: float, loss: float) -> int:
    me = [sys.executable, "-m", "rocev2_emu"]
    common = ["--tdf", str(tdf), "--loss", str(loss), "-p", "18516"]
    runs = [("write-bw", ["-s", "65536", "-n", "400"]), ("write-lat", ["-n", "200"])]
    print(
        f"rocev2-emu demo: two NIC processes, server 127.0.0.2 and client 127.0.0.3, direct "
        f"100 Gbit/s link, TDF {tdf:g}; metrics at http://127.0.0.2:9102/metrics and "
        "http://127.0.0.3:9103/metrics while each test runs\n"
    )
    for test, extra in runs:
        server = subprocess.Popen(
            [*me, test, *common, *extra, "--metrics-port", "9102", "--nic-addr", "127.0.0.2"],
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            wait_until_listening(server)
            client = subprocess.run(
                [
                    *me,
                    test,
                    "127.0.0.1",
                    *common,
                    *extra,
                    "--metrics-port",
                    "9103",
                    "--nic-addr",
                    "127.0.0.3",
                ],
                timeout=600,
            )
        finally:
            server.communicate(timeout=60)  # its table is the client's, seen from the far end
        if client.returncode or server.returncode:
            print(
                f"demo: {test} failed (client {client.returncode}, server {server.returncode})",
                file=sys.stderr,
            )
            return 1
        print()
    return 0


register(
    Command(
        "demo",
        "the all-reduce benchmark on the shipped leaf-spine, one process per node, with "
        "metrics (--perftest: write-bw and write-lat between two NICs)",
        _configure,
        _run,
    )
)
