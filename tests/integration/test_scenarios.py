"""The scenarios with one process per node: shorter runs, the same checks.

On the exact clock (``--clock exact``) a run with processes is the virtual run of the same
scale, whatever the machine's load: its checks must pass, and its results and counters must be
the virtual run's.  The dilation scenario measures the wall clock's own dilation, which a
machine too busy to keep up with its processes cannot honour: a run of it that fell behind
(late wake-ups or kernel drops, which every run reports) is run once more at four times the
TDF; if that one falls behind too the test skips and says how far behind, rather than report
the machine's load as the emulator's failure.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from rocev2_emu.experiments import harness
from rocev2_emu.experiments.catalog import SCENARIOS
from rocev2_emu.experiments.harness import VIRTUAL
from rocev2_emu.fabric.options import Clock, RunOptions

pytestmark = pytest.mark.integration


def behind(data: dict[str, Any]) -> tuple[int, int]:
    """Late wake-ups and kernel drops over a scenario's runs with processes."""
    fabrics = [run["fabric"] for run in data["runs"] if not run["times"]]
    return (
        sum(f.get("late_wakeups", 0) for f in fabrics),
        sum(f.get("socket_drops", 0) for f in fabrics),
    )


@pytest.mark.timeout(600)
@pytest.mark.parametrize("name", ["incast", "pfc-unfairness"])
def test_scenario_checks_hold_with_real_processes_on_the_exact_clock(
    name: str, tmp_path: Path
) -> None:
    code = harness.main(name, seed=2, out=str(tmp_path), options=RunOptions())
    data = json.loads((tmp_path / f"{name}.json").read_text())
    assert all(r["verified"] for run in data["runs"] for r in run["results"])
    assert code == 0 and data["ok"] is True, data["report"]


@pytest.mark.timeout(600)
def test_the_incast_scenario_with_processes_is_its_virtual_run(tmp_path: Path) -> None:
    scale = {"senders": 4, "size": 1 << 20}
    runs = {}
    for mode, exact in (("virtual", False), ("exact", True)):
        out = tmp_path / mode
        harness.main(
            "incast", seed=3, out=str(out), options=RunOptions() if exact else VIRTUAL, scale=scale
        )
        runs[mode] = json.loads((out / "incast.json").read_text())["runs"]
    assert len(runs["exact"]) == len(runs["virtual"]) == 4
    for virtual, exact in zip(runs["virtual"], runs["exact"], strict=True):
        assert exact["results"] == virtual["results"]
        assert exact["fabric"] == virtual["fabric"]


def test_a_scenario_that_cannot_run_exact_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    assert harness.main("dilation", seed=1, out=None, options=RunOptions()) == 2
    assert "takes no --clock exact: it measures the wall clock" in capsys.readouterr().err


@pytest.mark.parametrize(("name", "tdf"), [("dilation", 1000.0)])
def test_scenario_checks_hold_with_real_processes(name: str, tdf: float, tmp_path: Path) -> None:
    assert name in SCENARIOS
    for attempt in (tdf, 4 * tdf):
        out = tmp_path / f"tdf{attempt:g}"
        code = harness.main(name, seed=2, out=str(out), options=RunOptions(Clock.WALL, attempt))
        data = json.loads((out / f"{name}.json").read_text())
        # bytes are never the machine's fault: every flow is verified whatever the load
        assert all(r["verified"] for run in data["runs"] for r in run["results"])
        late, dropped = behind(data)
        if code == 0 and data["ok"] is True:
            return
        if not late and not dropped:
            pytest.fail(f"{name} failed a check in a faithful run: {data['report']}")
    pytest.skip(
        f"this machine is overloaded: {late} late wake-ups and {dropped} kernel drops even at "
        f"TDF {4 * tdf:g}, so {name}'s timing checks would measure the machine"
    )


@pytest.mark.timeout(600)
def test_the_fct_scenario_with_processes_is_its_virtual_run(tmp_path: Path) -> None:
    """40 web-search flows at 50 % load under DCQCN: the exact clock's slowdown rows, counters
    included, are the virtual run's byte for byte."""
    scale = {"settings": ("dcqcn-paper",), "loads": (0.5,), "iterations": 1, "flows": 40}
    rows = {}
    for mode, exact in (("virtual", False), ("exact", True)):
        out = tmp_path / mode
        code = harness.main(
            "fct", seed=2, out=str(out), options=RunOptions() if exact else VIRTUAL, scale=scale
        )
        assert code == 0
        rows[mode] = (out / "fct.json").read_text()
    virtual, exact = (json.loads(rows[m])["runs"] for m in ("virtual", "exact"))
    assert virtual[0]["completed"] == 40 and virtual[0]["cnps_sent"] > 0
    assert exact == virtual
