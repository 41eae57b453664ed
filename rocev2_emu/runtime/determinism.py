"""Deterministic trio scheduling for virtual runs: the one place that touches trio's internals.

Trio shuffles the order of runnable tasks on purpose (``trio._core._run``: a batch of runnable
tasks is reversed at random, driven by the module's ``_r``, unless
``_ALLOW_DETERMINISTIC_SCHEDULING`` is set - the hook trio keeps for deterministic test runners
such as hypothesis-trio).  Trio has no public way to seed that shuffle, and a virtual run must
give the same result for the same seed every time, so this module sets the hook and seeds
``_r``.  If a trio upgrade renames either, :func:`seed_trio_scheduler` raises instead of running
a virtual job that would no longer repeat, and ``tests/unit/runtime/test_determinism.py``
fails.
"""

from __future__ import annotations

import sys
from typing import Any


class SchedulingNotSeedable(RuntimeError):
    """This trio has no hook for deterministic scheduling (its internals changed)."""


def seed_trio_scheduler(seed: int) -> None:
    """Seed trio's shuffle of runnable tasks, for every ``trio.run`` that follows."""
    import trio  # noqa: F401  (trio._core._run must be loaded)

    run: Any = sys.modules.get("trio._core._run")
    if run is None or not hasattr(run, "_ALLOW_DETERMINISTIC_SCHEDULING") or not hasattr(run, "_r"):
        raise SchedulingNotSeedable(
            "trio._core._run has no _ALLOW_DETERMINISTIC_SCHEDULING / _r: this trio's "
            "scheduler cannot be seeded, so virtual runs would not repeat; pin a trio that has "
            "them or update rocev2_emu/runtime/determinism.py"
        )
    run._ALLOW_DETERMINISTIC_SCHEDULING = True
    run._r.seed(seed)
