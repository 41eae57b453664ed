"""Jobs by name, so a launcher can ask a host process to run one over the wire.

A job is a coroutine taking the rank's :class:`~collectives.communicator.Communicator` and a
parameter dict, returning what msgpack can carry.  :mod:`collectives.checks` and
:mod:`collectives.bench` register theirs with :func:`job`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collectives.communicator import Communicator

Job = Callable[["Communicator", dict[str, Any]], Awaitable[Any]]
JOBS: dict[str, Job] = {}


def job(name: str) -> Callable[[Job], Job]:
    def register(fn: Job) -> Job:
        JOBS[name] = fn
        return fn

    return register
