"""The two builds of the protocol cores (setup.py, rocev2_emu/cores.py): the installed one is
compiled where CI installs it, and the compiled and pure builds run seeded virtual jobs to the
same JSON, byte for byte."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rocev2_emu import cores

ROOT = Path(__file__).resolve().parents[2]


def _run(args: list[str], *, pure: bool, timeout: float) -> str:
    env = {k: v for k, v in os.environ.items() if k != cores.PURE_ENV}
    if pure:
        env[cores.PURE_ENV] = "1"
    proc = subprocess.run(
        args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


def _require_compiled() -> None:
    if cores.BUILD != "compiled":
        message = f"the cores are not compiled here ({cores.WHY})"
        if os.environ.get("CI") == "true":
            pytest.fail(message + "; the README's install compiles them", pytrace=False)
        pytest.skip(message)


def test_version_names_the_build_that_runs() -> None:
    exe = [str(Path(sys.executable).parent / "rocev2-emu")]
    _require_compiled()
    assert "cores: compiled (mypyc " in _run([*exe, "--version"], pure=False, timeout=60)
    pure = _run([*exe, "--version"], pure=True, timeout=60)
    assert "cores: pure (ROCEV2_EMU_PURE=1)" in pure


@pytest.mark.timeout(600)
def test_compiled_and_pure_cores_give_the_same_json_byte_for_byte() -> None:
    _require_compiled()
    args = [sys.executable, "-m", "tests.integration.cores_runs"]
    compiled = _run(args, pure=False, timeout=300)
    pure = _run(args, pure=True, timeout=500)
    a, b = json.loads(compiled), json.loads(pure)
    assert (a.pop("build"), b.pop("build")) == ("compiled", "pure")
    assert a["incast"]["fabric"]["frame_hops"] > 1000
    assert a["faulty"]["fabric"] != a["incast"]["fabric"]  # the faults changed the run
    assert all(r["verified"] for r in a["faulty"]["results"])
    assert a["scenario_incast"]["ok"] is True  # its four settings ran and its checks passed
    assert json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


@pytest.mark.timeout(300)
def test_fuzzed_datagrams_raise_in_neither_build_and_both_count_the_same() -> None:
    """200 000 seeded datagrams into a switch and a NIC (tests/integration/cores_fuzz.py): no
    input raises in either build (a raise exits non-zero), and every counter agrees."""
    _require_compiled()
    args = [sys.executable, "-m", "tests.integration.cores_fuzz", "200000", "5"]
    a = json.loads(_run(args, pure=False, timeout=120))
    b = json.loads(_run(args, pure=True, timeout=250))
    assert (a.pop("build"), b.pop("build")) == ("compiled", "pure")
    assert a["switch"]["ports"][0]["drops"]["malformed"] > 0
    assert a["nic"]["sent"] > 0 and sum(a["nic"]["drops"].values()) > 0
    assert json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)
