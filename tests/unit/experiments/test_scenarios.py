"""The incast scenario's checks hold in virtual time (a smaller incast than the CLI's default)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rocev2_emu.experiments import (
    fairness,
    fluid_model,
    harness,
    incast,
    pfc_unfairness,
    victim_flow,
)
from rocev2_emu.experiments.catalog import SCENARIOS
from rocev2_emu.experiments.runs import runs_json


def test_incast_scenario_checks_pass_and_results_are_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def small(seed: int, mode: harness.Mode) -> harness.Outcome:
        runs, lines, ok = incast.incast(seed, n=4, size=2 << 20, mode=mode)
        return harness.Outcome(runs_json(runs), lines, ok)

    monkeypatch.setitem(SCENARIOS, "incast", harness.Scenario("incast", small))
    assert harness.main("incast", seed=3, out=str(tmp_path), virtual=True) == 0
    out = capsys.readouterr().out
    assert out.count(": pass") == 4
    data = json.loads((tmp_path / "incast.json").read_text())
    assert data["ok"] is True
    lossy, pfc, both, paced = data["runs"]
    assert paced["fabric"]["pfc_tx"] == 0 and sum(paced["fabric"]["drops"].values()) == 0
    assert sum(lossy["fabric"]["drops"].values()) > 0
    assert sum(pfc["fabric"]["drops"].values()) == 0 and pfc["fabric"]["pfc_tx"] > 0
    assert both["fabric"]["cnps_sent"] > 0
    assert all(r["verified"] for run in data["runs"] for r in run["results"])
    assert len(lossy["times"]) == len(lossy["queue"]) > 10  # the time series was sampled


def test_unknown_scenario_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert harness.main("nope", seed=1, out=None, virtual=True) == 2
    assert "unknown scenario" in capsys.readouterr().err


def test_pfc_unfairness_checks_pass() -> None:
    runs, lines, ok = pfc_unfairness.pfc_unfairness(1, size=12 << 20)
    assert ok, lines
    pfc_shares = harness.steady_shares(runs[0])
    assert pfc_shares[0] == pytest.approx(50, rel=0.1)  # C/2 for the lone sender
    assert all(x == pytest.approx(100 / 6, rel=0.15) for x in pfc_shares[1:])  # C/6 each


def test_victim_flow_pfc_spreads_and_dcqcn_restores_the_victim() -> None:
    runs, lines, ok = victim_flow.victim_flow(1)
    assert ok, lines
    pfc, both = runs
    assert {"spine", "leaf1", "leaf2"} <= set(pfc.fabric["pfc_senders"])  # three switches
    assert both.fabric["cnps_sent"] > 0
    victim = next(r for r in pfc.results if r.src == "v")
    assert victim.dst == "w" and victim.verified


def test_fairness_flows_converge_to_fair_shares_and_recover() -> None:
    runs, lines, ok = fairness.fairness(1)
    assert ok, lines
    (run,) = runs
    assert [r.start for r in run.results] == pytest.approx([0.0, 5e-3, 10e-3, 15e-3])
    ends = [r.start + r.fct for r in run.results]
    assert ends == sorted(ends, reverse=True)  # last in, first out


def test_fluid_model_queue_matches_the_fixed_point(tmp_path: Path) -> None:
    runs, lines, ok = fluid_model.fluid_model(1, ns=(2, 8))
    assert ok, lines
    assert all(run.queue_reference for run in runs)
    assert sum("check: queue within 20 %" in line for line in lines) == 2
