"""``rocev2-emu bench KIND``: benchmarks that print figures, never assertions.

The built-in kinds measure datagram rates (:mod:`rocev2_emu.tools.bench`: ``udp-baseline``,
``write-bw``, ``switch``); plugins add theirs with :func:`register_bench` (the collectives add
``all-reduce``, ``all-gather``, ``reduce-scatter`` and ``broadcast``, with nccl-tests' flags).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass

from rocev2_emu.cli.commands import Command, register
from rocev2_emu.tools.bench import main as datagram_bench


@dataclass(frozen=True, slots=True)
class BenchKind:
    run: Callable[[str, argparse.Namespace], int]
    configure: Callable[[argparse.ArgumentParser], None] | None = None  # its own flags


BENCH_KINDS: dict[str, BenchKind] = {}


def register_bench(names: list[str], kind: BenchKind) -> None:
    """Add ``names`` to ``rocev2-emu bench``; ``kind.configure`` adds its flags once."""
    for name in names:
        BENCH_KINDS[name] = kind


def _datagrams(which: str, args: argparse.Namespace) -> int:
    return datagram_bench(which, args.seconds)


register_bench(["udp-baseline", "write-bw", "switch"], BenchKind(_datagrams))


def _configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("which", choices=list(BENCH_KINDS))
    p.add_argument("--seconds", type=float, default=3.0, help="length of each datagram run")
    configured: list[Callable[[argparse.ArgumentParser], None]] = []
    for kind in BENCH_KINDS.values():
        if kind.configure is not None and kind.configure not in configured:
            kind.configure(p)
            configured.append(kind.configure)


def _run(args: argparse.Namespace) -> int:
    return BENCH_KINDS[args.which].run(args.which, args)


register(
    Command(
        "bench",
        "print figures: datagram rates, or collectives as nccl-tests does",
        _configure,
        _run,
    )
)
