"""Emulated runs repeat exactly, in one process or many, only while trio's scheduler can be made
to run tasks that wake together in creation order: these fail loudly on a trio that renamed the
hook (rocev2_emu/runtime/determinism.py)."""

from __future__ import annotations

import sys

import pytest
import trio
import trio.testing

from rocev2_emu.runtime.determinism import SchedulingNotSeedable, canonical_trio_scheduler


def test_this_trio_has_the_hook_for_deterministic_scheduling() -> None:
    run = sys.modules["trio._core._run"]
    assert hasattr(run, "_ALLOW_DETERMINISTIC_SCHEDULING"), "trio renamed its scheduling hook"
    assert hasattr(run, "_r"), "trio renamed its scheduler's random generator"
    canonical_trio_scheduler()


def _schedule(tasks: list[int]) -> list[int]:
    """The order in which tasks that wake together run, after a few rounds; ``tasks`` are
    created in this order, and woken in the reverse order every round."""
    order: list[int] = []

    async def main() -> None:
        lots = {i: trio.lowlevel.ParkingLot() for i in tasks}

        async def task(i: int) -> None:
            for _ in range(5):
                await lots[i].park()
                order.append(i)

        async with trio.open_nursery() as nursery:
            for i in tasks:
                nursery.start_soon(task, i)
            for _ in range(5):
                await trio.testing.wait_all_tasks_blocked()
                for i in reversed(tasks):
                    lots[i].unpark_all()

    canonical_trio_scheduler()
    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    return order


def test_tasks_that_wake_together_run_in_creation_order() -> None:
    assert _schedule(list(range(20))) == list(range(20)) * 5


def test_a_host_s_tasks_keep_their_order_whatever_else_shares_the_process() -> None:
    """The exact process mode's premise: one host's tasks (here the even ones) run in the same
    relative order alone as beside another host's."""
    together = [i for i in _schedule(list(range(20))) if i % 2 == 0]
    assert together == _schedule(list(range(0, 20, 2)))


def test_a_trio_without_the_hook_is_an_error_not_a_silent_change(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    run = sys.modules["trio._core._run"]
    monkeypatch.delattr(run, "_ALLOW_DETERMINISTIC_SCHEDULING")
    with pytest.raises(SchedulingNotSeedable, match="cannot be made deterministic"):
        canonical_trio_scheduler()
