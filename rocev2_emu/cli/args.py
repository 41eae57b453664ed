"""Argument types for the command line: a bad value is argparse's one-line usage error naming
the flag, never a traceback from deep inside a run (a negative size, a NaN rate)."""

from __future__ import annotations

import argparse
import math

from rocev2_emu.fabric.options import Clock, RunOptions
from rocev2_emu.topology.model import PAYLOADS, Topology


def _number(text: str, kind: type[int] | type[float]) -> float:
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
    return value


def positive_int(text: str) -> int:
    value = int(_number(text, int))
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text} must be at least 1")
    return value


def nonnegative_int(text: str) -> int:
    value = int(_number(text, int))
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text} must be >= 0")
    return value


def positive_float(text: str) -> float:
    value = _number(text, float)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text} must be > 0")
    return value


def nonnegative_float(text: str) -> float:
    value = _number(text, float)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text} must be >= 0")
    return value


def probability(text: str) -> float:
    value = _number(text, float)
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"{text} is not a probability (0 to 1)")
    return value


def loads(text: str) -> tuple[float, ...]:
    """Comma-separated loads, each a fraction of the line rate in (0, 1]."""
    values = tuple(_number(x, float) for x in text.split(",") if x)
    if not values or not all(0 < v <= 1 for v in values):
        raise argparse.ArgumentTypeError(f"{text} is not loads in (0, 1], comma-separated")
    return values


def port_number(text: str) -> int:
    value = int(_number(text, int))
    if not 0 < value < 65536:
        raise argparse.ArgumentTypeError(f"{text} is not a port (1 to 65535)")
    return value


def sync_address(text: str) -> tuple[str, int] | str:
    """``HOST:PORT``, or the absolute path of a Unix socket (what ``rocev2-emu up`` gives the
    node processes it starts on this machine)."""
    if text.startswith("/"):
        return text
    return host_port(text)


def host_port(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (HOST an address or a name, PORT 1-65535)."""
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise argparse.ArgumentTypeError(f"{text!r} is not HOST:PORT (e.g. 172.30.0.251:7470)")
    return host, int(port)


def add_payload(p: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """``--payload real|none`` (every command that runs a fabric with a job takes it)."""
    p.add_argument(
        "--payload",
        choices=PAYLOADS,
        help="real: frames carry their bytes and every value is checked; none: timing only - "
        "frames carry their headers (their lengths count on the wire), no payload is copied, "
        "no ICRC computed, no arithmetic done: every emulated time, mark, pause and "
        "retransmission is the real run's, values are not checked (default: the topology's "
        "[fabric] payload, else real)",
    )


def with_payload(topo: Topology, payload: str | None) -> Topology:
    """``topo`` with ``--payload`` applied, if given."""
    if payload is not None:
        topo.payload = payload
    return topo


PROCESS_CLOCKS = (Clock.EXACT, Clock.WALL)  # with processes; virtual is one process

_WORKERS = (
    "with --clock exact (or --virtual): N processes, each hosting a group of nodes (a switch "
    "with its hosts), instead of one per node (or one in all) - the same results"
)
_PACE = (
    "with --clock exact: at least N wall seconds per emulated second (still exact; a run that "
    "cannot keep up goes slower, never differently), to follow the map live"
)


def add_run_options(
    p: argparse.ArgumentParser | argparse._ArgumentGroup,
    default: str | None,
    says: str = "",
    *,
    virtual: bool | str = True,
    tdf: str = "the wall clock's time-dilation factor (default: the topology's)",
    tdf_default: float | None = None,
    workers: str | None = _WORKERS,
    pace: bool = True,
    payload: bool = True,
) -> None:
    """The flags of a run's :class:`~rocev2_emu.fabric.options.RunOptions`, defined here once
    for every command: ``--clock`` (``--virtual`` its alias where the command runs in one
    process too), ``--tdf``, ``--workers``, ``--pace`` and ``--payload``.  ``default``: the
    clock (None: exact for a run with a job, wall for a fabric left running,
    :func:`run_options`); ``says``: what the command adds to ``--clock``'s help; ``virtual``:
    whether it runs in one process too (a string: ``--virtual``'s help); ``workers``: that
    flag's help (None: not taken)."""
    clocks = [str(c) for c in (Clock.VIRTUAL, *PROCESS_CLOCKS)] if virtual else PROCESS_CLOCKS
    p.add_argument(
        "--clock",
        choices=[str(c) for c in clocks],
        default=default,
        help="exact: every node on emulated time, synchronised - the figures of one process "
        "in virtual time, on any machine however loaded; wall: dilated by the TDF, for live "
        "interop"
        + ("; virtual: one process (as --virtual)" if virtual else "")
        + (f"; {says}" if says else f" (default {default})"),
    )
    if virtual:
        says_virtual = virtual if isinstance(virtual, str) else "in virtual time, one process"
        p.add_argument("--virtual", action="store_true", help=says_virtual)
    p.add_argument("--tdf", type=positive_float, default=tdf_default, help=tdf)
    if workers is not None:
        p.add_argument("--workers", type=positive_int, metavar="N", help=workers)
    if pace:
        p.add_argument("--pace", type=positive_float, metavar="N", help=_PACE)
    if payload:
        add_payload(p)


def run_options(args: argparse.Namespace, job: bool) -> RunOptions:
    """The run's options from :func:`add_run_options`' flags: the clock is ``--virtual`` or
    ``--clock``, else exact for a run with a job and wall for a fabric left running; virtual
    time split over ``--workers`` runs on the exact clock (its windows give the one process's
    run).  A flag the clock does not take is a ValueError naming it."""
    clock = Clock.VIRTUAL if getattr(args, "virtual", False) else args.clock
    clock = Clock(clock) if clock is not None else Clock.EXACT if job else Clock.WALL
    workers = getattr(args, "workers", None)
    if clock is Clock.VIRTUAL and workers is not None:
        clock = Clock.EXACT
    return RunOptions(
        clock,
        tdf=args.tdf,
        workers=workers,
        pace=getattr(args, "pace", None),
        payload=getattr(args, "payload", None),
    )
