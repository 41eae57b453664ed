"""What a new user and the reliability checks hit (issue 28): a flag whose extra is missing is
refused before anything starts, a host that cannot reach the rendezvous store says where, and
an attached exact job names the node processes that never joined or the flags it cannot take."""

from __future__ import annotations

import importlib.util
import socket
from pathlib import Path
from typing import Any

import pytest

from collectives.jobs.job import run_host_ranks
from collectives.jobs.launch import ExactCollectiveJob
from rocev2_emu.cli import main
from rocev2_emu.runtime.coordinator import Coordinator
from rocev2_emu.runtime.sync_messages import SyncError
from rocev2_emu.topology.file import load
from rocev2_emu.topology.generate import single_switch
from rocev2_emu.verbs import RemoteVerbsError


def test_a_ui_flag_without_the_ui_extra_is_refused_before_anything_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    real = importlib.util.find_spec

    def without_starlette(name: str, *args: Any) -> Any:
        return None if name == "starlette" else real(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", without_starlette)
    topo = tmp_path / "t.toml"
    topo.write_text(single_switch(2))
    for argv in (["up", str(topo), "--ui"], ["demo", "--ui"], ["scenario", "incast", "--ui"]):
        assert main(argv) == 1
        err = capsys.readouterr().err
        assert err.count("\n") == 1, err  # one line, no traceback
        assert "--ui needs the ui extra (starlette not installed)" in err
        assert "pip install 'rocev2-emu[ui]'" in err


async def test_an_unreachable_store_is_one_error_naming_it(
    tmp_path: Path, fabric_secret: bytes
) -> None:
    path = tmp_path / "t.toml"
    path.write_text(single_switch(2))
    topo = load(path)
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(RemoteVerbsError, match=f"rendezvous store at 127.0.0.1:{port}: "):
        await run_host_ranks(None, topo, "h0", ("127.0.0.1", port), "bench", {})  # type: ignore[arg-type]


async def test_an_attached_exact_job_names_the_node_processes_that_never_joined(
    tmp_path: Path,
) -> None:
    path = tmp_path / "t.toml"
    path.write_text(single_switch(2))
    coordinator = Coordinator(["sw0", "h0", "h1"], 1e-6, b"")
    job = ExactCollectiveJob("bench", {}, coordinator, join_timeout=0.2)
    with pytest.raises(SyncError, match=r"not joined within 0.2 s: h0, h1, sw0$"):
        await job.run(load(path), 1.0, 0.0)


def test_bench_refuses_what_an_attached_exact_run_cannot_take(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "t.toml"
    path.write_text(single_switch(2))
    bench = ["bench", "all-reduce", "--topology", str(path)]
    for flags, said in (
        (["--attach", "--clock", "exact"], "--clock exact --attach needs --sync HOST:PORT"),
        (["--sync", "127.0.0.1:7470"], "--sync serves the coordinator of --clock exact --attach"),
    ):
        assert main([*bench, *flags]) == 1
        assert said in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main([*bench, "--sync", "7470"])
    assert "is not HOST:PORT" in capsys.readouterr().err


def test_a_wall_clock_node_refuses_the_exact_runs_flags(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "t.toml"
    path.write_text(single_switch(2))
    node = ["node", str(path), "h0"]
    assert main([*node, "--sync", "127.0.0.1:7470", "--join-timeout", "5"]) == 1
    err = capsys.readouterr().err
    assert "--sync, --join-timeout: for a node of an exact run (--clock exact)" in err, err
    with pytest.raises(SystemExit):
        main([*node, "--clock", "exact", "--sync", "127.0.0.1:7470", "--join-timeout", "-1"])
    assert "must be >= 0" in capsys.readouterr().err
