"""Jobs by name, so a launcher can ask a host process to run one over the wire.

A job is a coroutine taking the rank's :class:`~collectives.comm.communicator.Communicator` and a
parameter dict, returning what msgpack can carry.  :mod:`collectives.bench.checks` and
:mod:`collectives.bench.nccl` register theirs with :func:`job`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collectives.comm.communicator import Communicator

Job = Callable[["Communicator", dict[str, Any]], Awaitable[Any]]
JOBS: dict[str, Job] = {}


def job_named(name: str) -> Job:
    """The job registered as ``name`` (a KeyError naming those registered: the module that
    defines a job registers it when imported; :mod:`collectives.plugin` imports them all)."""
    try:
        return JOBS[name]
    except KeyError:
        raise KeyError(f"no collective job {name!r}; registered: {sorted(JOBS)}") from None


def job(name: str) -> Callable[[Job], Job]:
    def register(fn: Job) -> Job:
        JOBS[name] = fn
        return fn

    return register
