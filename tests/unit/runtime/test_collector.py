"""The collector's settings during an engine run are the run's only: put back afterwards."""

from __future__ import annotations

import gc

import pytest

from rocev2_emu.runtime.collector import RUN_THRESHOLDS, engine_collector


def _failing_run(seen: dict[str, object]) -> None:
    with engine_collector():
        seen["threshold"] = gc.get_threshold()
        seen["frozen"] = gc.get_freeze_count()
        raise RuntimeError("the run failed")


def test_the_run_freezes_the_setup_and_puts_the_collector_back_even_on_error() -> None:
    before = gc.get_threshold()
    setup = [object() for _ in range(10)]
    seen: dict[str, object] = {}
    with pytest.raises(RuntimeError, match="the run failed"):
        _failing_run(seen)
    assert seen["threshold"] == RUN_THRESHOLDS
    assert isinstance(seen["frozen"], int) and seen["frozen"] >= len(setup)  # never walked
    assert gc.get_threshold() == before
    assert gc.get_freeze_count() == 0
