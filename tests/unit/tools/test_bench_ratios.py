"""The datagram benches print a ratio only of two measured rates: a run where nothing came
through says so in one line and exits 1, never ZeroDivisionError (issue #28, item 2)."""

from __future__ import annotations

import pytest

from rocev2_emu.tools import bench


@pytest.mark.parametrize(("plain", "switch"), [(1000.0, 0.0), (0.0, 1000.0)])
def test_a_switch_run_where_nothing_came_through_says_so(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], plain: float, switch: float
) -> None:
    monkeypatch.setattr(bench, "switch_vs_forwarder", lambda seconds: (plain, switch))
    assert bench.main("switch", 0.1) == 1
    out = capsys.readouterr().out
    assert "no frame came through" in out and "\nratio " not in out


def test_a_write_bw_run_with_a_zero_baseline_says_so(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(bench, "udp_baseline", lambda seconds: 0.0)
    monkeypatch.setattr(bench, "nic_write_bw", lambda seconds: (5000.0, "write-bw table\n"))
    assert bench.main("write-bw", 0.1) == 1
    out = capsys.readouterr().out
    assert "no datagram came through the plain UDP baseline" in out and "\nratio " not in out
