"""The scenarios with one process per node: shorter runs, the same checks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rocev2_emu.experiments import harness
from rocev2_emu.experiments.catalog import SCENARIOS

pytestmark = pytest.mark.integration


@pytest.mark.parametrize(
    ("name", "tdf"), [("incast", 1000.0), ("pfc-unfairness", 2000.0), ("dilation", 1000.0)]
)
def test_scenario_checks_hold_with_real_processes(name: str, tdf: float, tmp_path: Path) -> None:
    assert name in SCENARIOS
    assert harness.main(name, seed=2, out=str(tmp_path), virtual=False, tdf=tdf) == 0
    data = json.loads((tmp_path / f"{name}.json").read_text())
    assert data["ok"] is True
    assert all(r["verified"] for run in data["runs"] for r in run["results"])
