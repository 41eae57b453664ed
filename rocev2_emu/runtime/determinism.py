"""Deterministic trio scheduling for emulated time: the one place that touches trio's internals.

Trio shuffles the order of runnable tasks on purpose (``trio._core._run``: a batch of runnable
tasks is reversed at random, driven by the module's ``_r``, unless
``_ALLOW_DETERMINISTIC_SCHEDULING`` is set - the hook trio keeps for deterministic test runners
such as hypothesis-trio - in which case the batch is sorted by task creation and then shuffled
with ``_r``).  An emulated run must give the same result every time, and the same result
whether its hosts share one process (virtual time) or each has its own (the exact process
mode), so this module sets the hook and makes the shuffle a no-op: tasks that become runnable
together run in the order they were created.  A host's tasks are created in its own order
whatever else shares the process, so each host's tasks run in the same relative order in every
split of the fabric.  If a trio upgrade renames the hook, :func:`canonical_trio_scheduler`
raises instead of running a job that would no longer repeat, and
``tests/unit/runtime/test_determinism.py`` fails.
"""

from __future__ import annotations

import random
import sys
from typing import Any


class SchedulingNotSeedable(RuntimeError):
    """This trio has no hook for deterministic scheduling (its internals changed)."""


class _CreationOrder(random.Random):
    """trio's ``_r`` whose shuffle puts the batch (sorted by creation) in the order trio runs
    it in creation order: trio pops the batch from its end."""

    def shuffle(self, x: Any) -> None:
        x.reverse()


def canonical_trio_scheduler() -> None:
    """Tasks that wake together run in creation order, in every ``trio.run`` that follows."""
    import trio  # noqa: F401  (trio._core._run must be loaded)

    run: Any = sys.modules.get("trio._core._run")
    if run is None or not hasattr(run, "_ALLOW_DETERMINISTIC_SCHEDULING") or not hasattr(run, "_r"):
        raise SchedulingNotSeedable(
            "trio._core._run has no _ALLOW_DETERMINISTIC_SCHEDULING / _r: this trio's "
            "scheduler cannot be made deterministic, so emulated runs would not repeat; pin a "
            "trio that has them or update rocev2_emu/runtime/determinism.py"
        )
    run._ALLOW_DETERMINISTIC_SCHEDULING = True
    if not isinstance(run._r, _CreationOrder):
        run._r = _CreationOrder(0)
