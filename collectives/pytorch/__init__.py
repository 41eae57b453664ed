"""The ``rocev2`` torch.distributed backend: a PyTorch program's collectives over the fabric.

``import collectives.pytorch`` registers the backend (the ``torch.backends`` entry point,
:mod:`~collectives.pytorch.autoload`, does it on ``import torch`` too, so an unchanged script
works), and then::

    dist.init_process_group("rocev2")

under the environment :mod:`collectives.launcher` (``rocev2-emu launch``) gives each rank
(torchrun's variables and where the fabric is) makes this process the emulated host of its
rank, its NIC in a trio thread (:mod:`~collectives.pytorch.worker`), and returns a process
group whose operations cross the emulated switches as RoCEv2 frames
(:mod:`~collectives.pytorch.group`).  :func:`step` reports a training step's interconnect tax
(:mod:`~collectives.pytorch.accounting`).

This module imports only torch.distributed: the rest loads when a group is made.
"""

from __future__ import annotations

import atexit
import datetime
from typing import Any

import torch.distributed as dist

BACKEND = "rocev2"
_GROUPS: list[Any] = []  # the groups this process made (the first is the default group's)


def _create(store: Any, rank: int, size: int, timeout: datetime.timedelta) -> Any:
    """torch's backend creator: join the fabric as host ``rank`` (blocks until every rank has
    connected, or ``timeout``)."""
    from collectives.pytorch.group import RoceProcessGroup
    from collectives.pytorch.worker import FabricWorker, RankEnv

    if _GROUPS:
        raise ValueError(
            "rocev2 backend: one process group per process (new_group over the fabric is not "
            "supported; each rank's process is its host)"
        )
    worker = FabricWorker(RankEnv.from_environ(rank, size), timeout.total_seconds())
    worker.start()
    atexit.register(worker.close)  # before the interpreter (and torch) shut down
    group = RoceProcessGroup(worker, rank, size, timeout.total_seconds())
    _GROUPS.append(group)
    return group


def register() -> None:
    """Make ``rocev2`` a torch.distributed backend (again is harmless)."""
    if BACKEND.upper() not in dist.Backend._plugins:  # the entry point may have done it
        dist.Backend.register_backend(BACKEND, _create, devices=["cpu"])


def step(compute_ms: float | None = None) -> Any:
    """End a training step: what its collectives took on the fabric and the tax under the
    model of :mod:`collectives.pytorch.accounting` (``compute_ms``: the modelled accelerator
    compute per step, emulated; default ``$ROCEV2_COMPUTE_MS`` or 0)."""
    from collectives.pytorch.accounting import end_step

    if not _GROUPS:
        raise RuntimeError("rocev2 backend: no process group; call init_process_group first")
    return end_step(_GROUPS[0].worker, compute_ms)


def worker_env() -> Any:
    """Where this rank runs (:class:`~collectives.pytorch.worker.RankEnv`: topology, host,
    rank, TDF)."""
    if not _GROUPS:
        raise RuntimeError("rocev2 backend: no process group; call init_process_group first")
    return _GROUPS[0].worker.env


def counters() -> dict[str, Any]:
    """The fabric's counters now (this rank's NIC and every switch): ``pfc_tx`` pause frames,
    ``ecn_marked``, ``cnps_sent``, ``retransmitted``, ``drops`` ... as in ``rocev2-emu up``'s
    summary."""
    if not _GROUPS:
        raise RuntimeError("rocev2 backend: no process group; call init_process_group first")
    result: dict[str, Any] = _GROUPS[0].worker.counters()
    return result


register()
