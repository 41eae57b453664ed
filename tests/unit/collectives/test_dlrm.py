"""The recommendation job (collectives/bench/dlrm.py) and its scenario: every embedding and
gradient lands where it belongs, the step splits into its phases, and the scenario's checks
pass with its plot written."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest

from collectives.bench import dlrm
from collectives.jobs.job import run_virtual
from rocev2_emu.experiments.harness import VIRTUAL
from rocev2_emu.fabric.options import Clock, RunOptions
from rocev2_emu.topology.file import parse
from rocev2_emu.topology.generate import single_switch
from tests.conftest import assert_png


def test_a_dlrm_step_moves_every_embedding_and_gradient_right_and_splits_the_tax() -> None:
    topo = parse(tomllib.loads(single_switch(2, servers=None)))
    topo.nodes["h0"].ranks = topo.nodes["h1"].ranks = 2  # 4 ranks, two per server
    params = {"steps": 2, "batch": 16, "tables": 1, "dim": 8, "mlp_bytes": 64 << 10}
    results, _ = run_virtual(topo, "dlrm", params | {"compute_us": 50.0})
    assert sorted(results) == [0, 1, 2, 3], results
    assert all(len(steps) == 2 for steps in results.values())
    got = dlrm.summary(results)
    assert got["wrong"] == 0
    assert got["compute"] == pytest.approx(50e-6)
    assert got["all_to_all"] > 0 and got["all_reduce"] > 0
    # the slowest rank's step holds every phase of the mean rank
    assert got["step"] >= got["all_to_all"] + got["all_reduce"] + got["compute"] - 1e-9
    assert got["tax"] == pytest.approx(1 - 50e-6 / got["step"])
    assert 0 < got["a2a_share"] + got["ar_share"] <= got["tax"] + 1e-9


# four virtual runs of 16 accelerators of an AI zone, one step each, with real bytes and
# timing-only: ~1 min here
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_recommendation_scenario_checks_pass_plots_and_times_the_same_without_bytes(
    tmp_path: Path,
) -> None:
    from collectives.plugin import register
    from rocev2_emu.experiments import harness

    register()
    scale = {"iterations": 1}
    assert (
        harness.main("recommendation", seed=1, out=str(tmp_path), options=VIRTUAL, scale=scale) == 0
    )
    assert_png(tmp_path / "recommendation.png")
    rows = json.loads((tmp_path / "recommendation.json").read_text())["runs"]
    assert [r["setting"] for r in rows] == [
        "rack leaves, ring",
        "rack leaves, hierarchical",
        "rails, ring",
        "rails, hierarchical",
    ]
    assert all(r["ranks"] == 16 and r["wrong"] == 0 for r in rows)
    # timing-only (--payload none): the same report but for the values, which it does not check
    none = tmp_path / "none"
    code = harness.main(
        "recommendation",
        seed=1,
        out=str(none),
        options=RunOptions(Clock.VIRTUAL, payload="none"),
        scale=scale,
    )
    assert code == 0
    data = json.loads((none / "recommendation.json").read_text())
    assert [{**r, "wrong": 0} for r in data["runs"]] == rows
    assert all(r["wrong"] is None for r in data["runs"])
    assert not any("every value right" in line for line in data["report"])
