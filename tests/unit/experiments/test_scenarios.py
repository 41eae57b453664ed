"""The incast scenario's checks hold in virtual time (a smaller incast than the CLI's default)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rocev2_emu.experiments import (
    catalog,
    fairness,
    fluid_model,
    harness,
    pfc_unfairness,
    victim_flow,
)
from rocev2_emu.experiments.harness import VIRTUAL
from rocev2_emu.experiments.plots import plot_runs
from rocev2_emu.topology.generate import fat_tree
from tests.conftest import assert_png


def test_incast_scenario_checks_pass_and_results_are_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert "incast" in catalog.SCENARIOS
    scale = {"senders": 4, "size": 2 << 20}
    assert harness.main("incast", seed=3, out=str(tmp_path), options=VIRTUAL, scale=scale) == 0
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
    assert_png(tmp_path / "incast.png")  # the plot extra is part of the test install


def test_incast_at_scale_on_a_fat_tree_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--senders``, ``--topology`` and ``--settings``: 15 -> 1 on a k = 4 fat-tree (its
    first 15 hosts into its last), PFC alone and with DCQCN; the checks of those settings
    (flows of 256 KiB last 21 us, under 10 base RTTs of 12 us: DCQCN's is not claimed)."""
    topo = tmp_path / "ft4.toml"
    topo.write_text(fat_tree(4))
    scale = {
        "senders": 15,
        "size": 256 << 10,
        "topology": str(topo),
        "settings": ("pfc", "pfc+dcqcn"),
    }
    assert harness.main("incast", seed=2, out=str(tmp_path), options=VIRTUAL, scale=scale) == 0
    out = capsys.readouterr().out
    assert "lossy" not in out and out.count(": pass") == 1
    assert "not checked: DCQCN's fewer pauses; a flow lasts 21.0 us" in out
    data = json.loads((tmp_path / "incast.json").read_text())
    pfc, both = data["runs"]
    assert [r["dst"] for r in pfc["results"]] == ["h15"] * 15
    assert sum(pfc["fabric"]["drops"].values()) == 0 and pfc["fabric"]["pfc_tx"] > 0
    assert len(pfc["fabric"]["pfc_senders"]) >= 2  # the pauses spread past the edge switch
    assert both["fabric"]["cnps_sent"] > 0


def test_a_scenario_refuses_scale_it_does_not_take(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rc = harness.main("fairness", seed=1, out=str(tmp_path), options=VIRTUAL, scale={"senders": 3})
    assert rc == 2
    assert "scenario fairness takes no --senders" in capsys.readouterr().err
    with pytest.raises(ValueError, match="unknown incast settings"):
        harness.main(
            "incast", seed=1, out=str(tmp_path), options=VIRTUAL, scale={"settings": ("nope",)}
        )


def test_unknown_scenario_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert harness.main("nope", seed=1, out=None, options=VIRTUAL) == 2
    assert "unknown scenario" in capsys.readouterr().err


def test_pfc_unfairness_checks_pass(tmp_path: Path) -> None:
    runs, lines, ok = pfc_unfairness.pfc_unfairness(1, size=12 << 20)
    assert ok, lines
    assert plot_runs("pfc-unfairness", runs, tmp_path / "pfc-unfairness.png")
    assert_png(tmp_path / "pfc-unfairness.png")
    pfc_shares = harness.steady_shares(runs[0])
    assert pfc_shares[0] == pytest.approx(50, rel=0.1)  # C/2 for the lone sender
    assert all(x == pytest.approx(100 / 6, rel=0.15) for x in pfc_shares[1:])  # C/6 each


def test_victim_flow_pfc_spreads_and_dcqcn_restores_the_victim(tmp_path: Path) -> None:
    runs, lines, ok = victim_flow.victim_flow(1)
    assert ok, lines
    assert plot_runs("victim-flow", runs, tmp_path / "victim-flow.png")
    assert_png(tmp_path / "victim-flow.png")
    pfc, both = runs
    assert {"spine", "leaf1", "leaf2"} <= set(pfc.fabric["pfc_senders"])  # three switches
    assert both.fabric["cnps_sent"] > 0
    victim = next(r for r in pfc.results if r.src == "v")
    assert victim.dst == "w" and victim.verified


def test_fairness_flows_converge_to_fair_shares_and_recover(tmp_path: Path) -> None:
    runs, lines, ok = fairness.fairness(1)
    assert ok, lines
    assert plot_runs("fairness", runs, tmp_path / "fairness.png")
    assert_png(tmp_path / "fairness.png")
    (run,) = runs
    assert [r.start for r in run.results] == pytest.approx([0.0, 5e-3, 10e-3, 15e-3])
    ends = [r.start + r.fct for r in run.results]
    assert ends == sorted(ends, reverse=True)  # last in, first out


def test_fluid_model_queue_matches_the_model_with_dcqcns_np(tmp_path: Path) -> None:
    runs, lines, ok = fluid_model.fluid_model(1, ns=(2, 16))
    assert ok, lines
    assert all(run.queue_reference for run in runs)
    assert sum("check: queue within 25% of the model with DCQCN's NP" in x for x in lines) == 2
    assert sum("check: the marking rates nearer the model with DCQCN's NP" in x for x in lines) == 1
    assert plot_runs("fluid-model", runs, tmp_path / "fluid-model.png")
    assert_png(tmp_path / "fluid-model.png")


def test_a_scenario_over_seeds_says_how_many_each_check_passed_with(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rc = harness.main_seeds("victim-flow", seed=5, seeds=2, out=str(tmp_path), options=VIRTUAL)
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "# victim-flow over seeds 5 to 6:" in out
    assert out.count("passed with 2 of 2 seeds") == 2 and "failed with" not in out
    for seed in (5, 6):
        data = json.loads((tmp_path / f"seed-{seed}" / "victim-flow.json").read_text())
        assert data["seed"] == seed and data["ok"] is True
    assert harness.main_seeds("nope", seed=1, seeds=3, out=str(tmp_path), options=VIRTUAL) == 2
