"""The ``rocev2-emu launch`` command: its arguments, and the launch they ask for
(:func:`collectives.launcher.launch`; ``--nproc-per-host`` writes the fabric with a NIC per
accelerator first)."""

from __future__ import annotations

import argparse
import tempfile
import tomllib
from pathlib import Path

from collectives.jobs.ranks import MASTER_PORT
from collectives.launcher import STORE_PORT, SYNC_PORT, launch, per_host
from rocev2_emu.cli import commands
from rocev2_emu.cli.args import add_run_options, nonnegative_float, positive_int, run_options
from rocev2_emu.fabric.options import Clock
from rocev2_emu.topology.file import load
from rocev2_emu.topology.generate import to_toml


def _args(p: argparse.ArgumentParser) -> None:
    p.usage = (
        "%(prog)s [-h] [--clock {wall,exact}] [--tdf TDF] [--ranks N] [--nproc-per-host N] "
        "[--compute-ms MS] [--ui [ADDR:PORT]] [--host NAME [--job ID]] TOPOLOGY -- COMMAND ..."
    )
    p.add_argument("topology", help="topology TOML file (see examples/topologies)")
    add_run_options(
        p,
        Clock.EXACT,
        "a rank's engine waits while its script computes",
        virtual=False,
        workers=None,
        pace=False,
        payload=False,
    )
    p.add_argument(
        "--ranks", type=positive_int, help="ranks on the first N hosts (default: every host)"
    )
    p.add_argument(
        "--compute-ms",
        type=nonnegative_float,
        default=0.0,
        help="modelled accelerator compute per training step, emulated ms, for the "
        "interconnect tax (ROCEV2_COMPUTE_MS; docs/pytorch.md)",
    )
    p.add_argument(
        "--ui",
        nargs="?",
        const="127.0.0.1:8080",
        metavar="ADDR:PORT",
        help="the fabric's live map while the program runs (docs/ui.md)",
    )
    p.add_argument(
        "--nproc-per-host",
        type=positive_int,
        default=1,
        metavar="N",
        help="N ranks per host, each with its own NIC on the host's links (one NIC per "
        "accelerator, as AI servers have; LOCAL_RANK 0..N-1): host hK becomes hK-0..hK-(N-1)",
    )
    p.add_argument(
        "--host",
        metavar="NAME",
        help="run only this host's rank, over switches already running (the compose "
        "testbed's training service: a container per host); the first host serves the "
        f"rendezvous on ports {STORE_PORT} and {MASTER_PORT}; with --clock exact, the run's "
        f"coordinator on port {SYNC_PORT}, which the other nodes join (rocev2-emu node ... "
        "--clock exact --sync ADDR:PORT)",
    )
    p.add_argument(
        "--job",
        default="torch",
        help="with --host: the job's name, the same for every rank (default torch)",
    )
    p.set_defaults(program=True)  # the command line after -- is args.rest
    p.epilog = "COMMAND comes after --: rocev2-emu launch TOPOLOGY -- python train.py ..."


def _run(args: argparse.Namespace) -> int:
    n = args.nproc_per_host
    if n > 1 and args.host is not None:
        raise ValueError("--nproc-per-host with --host: give each NIC's host (hK-i) instead")
    with tempfile.TemporaryDirectory(prefix="rocev2-launch-") as tmp:
        path = args.topology
        if n > 1:  # the fabric with N NICs per host, written for the nodes and ranks to read
            data = per_host(tomllib.loads(Path(path).read_text()), n)
            path = str(Path(tmp) / Path(path).name)
            Path(path).write_text(to_toml(data))
        topo = load(path)
        return launch(
            topo,
            path,
            run_options(args, job=True),
            list(args.rest),
            ranks=args.ranks,
            compute_ms=args.compute_ms,
            ui=args.ui,
            host=args.host,
            job_id=args.job,
            nproc_per_host=n,
        )


def register() -> None:
    commands.register(
        commands.Command(
            "launch",
            "run a program (a PyTorch script) on every host of a fabric, as torchrun does",
            _args,
            _run,
            description="Start the topology's switches, then one process per host running "
            'COMMAND with torchrun\'s environment; `dist.init_process_group("rocev2")` in it '
            "makes that process the host's NIC (docs/pytorch.md).",
        )
    )
