"""``scenario fct``: web-search flows at a load on the leaf-spine, the slowdown by flow size over
seeds, the literature's checks seed by seed, and timing-only runs equal to real payloads."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any

import pytest

from rocev2_emu.experiments import catalog, fct, harness
from rocev2_emu.experiments.harness import Mode
from rocev2_emu.fabric import slowdown
from rocev2_emu.fabric.options import Clock, RunOptions
from rocev2_emu.topology.generate import leaf_spine
from tests.conftest import assert_png


def test_fct_on_the_leaf_spine_checks_what_the_papers_agree_on(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """PFC alone and DCQCN (paper) at 30 % and 50 %, two seeds of 120 flows: DCQCN's short
    flows' tail under PFC alone's at each load, and a higher load lengthening it."""
    assert "fct" in catalog.SCENARIOS
    scale = {"settings": ("pfc", "dcqcn-paper"), "iterations": 2, "flows": 120}
    rc = harness.main(
        "fct",
        seed=1,
        out=str(tmp_path),
        options=RunOptions(Clock.VIRTUAL, payload="none"),
        scale=scale,
    )
    out = capsys.readouterr().out
    assert rc == 0, out
    assert out.count(": pass") == 4 and "FAIL" not in out  # completed, 2 x DCQCN < PFC, load
    assert "seeds 1-2" in out and "dcqcn-hpcc" not in out
    data = json.loads((tmp_path / "fct.json").read_text())
    rows = data["runs"]
    assert len(rows) == 2 * 2 * 2 and {r["seed"] for r in rows} == {1, 2}
    for row in rows:
        assert row["completed"] == row["flows"] == 120
        assert sum(b["flows"] for b in row["buckets"]) == 120
        assert all(1.0 <= b["p50"] <= b["p95"] <= b["p99"] for b in row["buckets"])
    pfc = [r for r in rows if r["setting"] == "pfc"]
    assert all(r["cnps_sent"] == 0 and r["ecn_marked"] == 0 for r in pfc)  # PFC alone: no ECN
    assert all(r["cnps_sent"] > 0 for r in rows if r["setting"] == "dcqcn-paper")
    assert_png(tmp_path / "fct.png")


def test_a_timing_only_run_has_the_real_payloads_figures() -> None:
    """One run's slowdown rows, byte for byte, with and without payload bytes."""
    base = tomllib.loads(leaf_spine(2, 4, 2))
    real, none = (
        fct.run_one(
            base, "dcqcn-paper", 0.5, 3, 60, "websearch", Mode(RunOptions(Clock.VIRTUAL, payload=p))
        )
        for p in (None, "none")
    )
    assert json.dumps(real) == json.dumps(none)


def _rows(low: list[float], high: list[float]) -> list[dict[str, Any]]:
    return [
        {"setting": s, "load": 0.3, "seed": k, "short_p95": v}
        for s, values in (("a", low), ("b", high))
        for k, v in enumerate(values)
    ]


def test_a_check_holds_only_when_every_seed_shows_the_effect() -> None:
    text, good = fct.below(_rows([2.0, 3.0, 4.0], [5.0, 3.5, 9.0]), ("a", 0.3), ("b", 0.3))
    assert good and "2.0 < 5.0, 3.0 < 3.5, 4.0 < 9.0" in text
    _, good = fct.below(_rows([2.0, 3.0, 4.0], [5.0, 2.5, 9.0]), ("a", 0.3), ("b", 0.3))
    assert not good  # one seed against it: inside the spread, not claimed


def test_fct_refuses_a_setting_it_does_not_have(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no setting"):
        fct.fct(1, Mode(settings=("pfc", "timely")))


def test_the_report_names_size_buckets() -> None:
    assert slowdown.span(10_000, 100_000) == "10K-100K"
    assert slowdown.span(10_000_000, None) == ">= 10M"
