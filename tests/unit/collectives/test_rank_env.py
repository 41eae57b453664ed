"""A PyTorch rank's launcher environment (:class:`collectives.pytorch.worker.RankEnv`): what it
takes, and the clear error for what it refuses."""

from __future__ import annotations

from pathlib import Path

import pytest

from collectives.pytorch.worker import BackendError, RankEnv

ROOT = Path(__file__).resolve().parents[3]
TOPOLOGY = str(ROOT / "examples" / "topologies" / "leaf-spine.toml")


@pytest.mark.parametrize("clock", ["exact", "wall"])
def test_the_metrics_linger_is_read_on_either_clock(
    monkeypatch: pytest.MonkeyPatch, clock: str
) -> None:
    monkeypatch.setenv("ROCEV2_TOPOLOGY", TOPOLOGY)
    monkeypatch.setenv("ROCEV2_CLOCK", clock)
    monkeypatch.setenv("ROCEV2_SYNC" if clock == "exact" else "ROCEV2_STORE", "127.0.0.1:29600")
    assert RankEnv.from_environ(1, 8).metrics_linger == 0.0  # not set: no linger
    monkeypatch.setenv("ROCEV2_METRICS_LINGER", "6")
    env = RankEnv.from_environ(1, 8)
    assert (env.host, env.metrics_linger) == ("h1", 6.0)
    assert (env.sync is not None) == (clock == "exact")
    for bad in ("-1", "601", "soon"):
        monkeypatch.setenv("ROCEV2_METRICS_LINGER", bad)
        with pytest.raises(BackendError, match="bad launcher environment"):
            RankEnv.from_environ(1, 8)
