"""Virtual runs repeat exactly only while trio's scheduler can be seeded: these fail loudly on a
trio that renamed the hook (rocev2_emu/runtime/determinism.py)."""

from __future__ import annotations

import sys

import pytest
import trio
import trio.testing

from rocev2_emu.runtime.determinism import SchedulingNotSeedable, seed_trio_scheduler


def test_this_trio_has_the_hook_for_deterministic_scheduling() -> None:
    run = sys.modules["trio._core._run"]
    assert hasattr(run, "_ALLOW_DETERMINISTIC_SCHEDULING"), "trio renamed its scheduling hook"
    assert hasattr(run, "_r"), "trio renamed its scheduler's random generator"
    seed_trio_scheduler(1)  # and it takes a seed


def _schedule(seed: int) -> list[int]:
    """The order in which 20 tasks that wake together run, after a few rounds."""
    order: list[int] = []

    async def main() -> None:
        async def task(i: int) -> None:
            for _ in range(5):
                await trio.lowlevel.checkpoint()
                order.append(i)

        async with trio.open_nursery() as nursery:
            for i in range(20):
                nursery.start_soon(task, i)

    seed_trio_scheduler(seed)
    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    return order


def test_the_same_seed_gives_the_same_schedule_and_another_seed_another() -> None:
    assert _schedule(7) == _schedule(7)
    assert _schedule(7) != _schedule(8)  # the shuffle is seeded, not switched off


def test_a_trio_without_the_hook_is_an_error_not_a_silent_change(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    run = sys.modules["trio._core._run"]
    monkeypatch.delattr(run, "_ALLOW_DETERMINISTIC_SCHEDULING")
    with pytest.raises(SchedulingNotSeedable, match="cannot be seeded"):
        seed_trio_scheduler(1)
