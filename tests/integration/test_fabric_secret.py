"""The control plane of a running fabric is authenticated: ``rocev2-emu up`` makes a secret
that only its user can read, hands it to the nodes in their environment (never on a command
line), clients of the same topology find it, a client holding another fabric's secret is
refused and changes nothing, and the secret goes when the fabric does."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

import pytest

from rocev2_emu.control import auth
from tests.integration.test_new_user import CLI, alive, children, fabric

pytestmark = pytest.mark.integration
ENV = {k: v for k, v in os.environ.items() if k not in (auth.ENV, auth.ENV_FILE)} | {
    "PYTHONUNBUFFERED": "1"
}


def run(*args: str, env: dict[str, str] = ENV) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=60, env=env)


@pytest.fixture
def topo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for name in (auth.ENV, auth.ENV_FILE):
        monkeypatch.delenv(name, raising=False)  # where this test looks, as a client would
    path = tmp_path / "two.toml"
    path.write_text(run("topology", "single-switch", "--hosts", "2", "--tdf", "2000").stdout)
    return path


def described(pids: set[int]) -> str:
    """Each process's name, state and parent (from /proc), for a failed assertion."""
    out = []
    for pid in sorted(pids):
        try:
            out.append(f"{pid}: {Path(f'/proc/{pid}/stat').read_text().split()[1:4]}")
        except OSError:
            out.append(f"{pid}: gone")
    return "; ".join(out)


def test_up_keeps_its_secret_private_and_serves_only_clients_that_hold_it(topo: Path) -> None:
    secret_file = auth.run_file(str(topo))
    assert not secret_file.exists()
    with fabric(topo, env=ENV) as proc:
        assert stat.S_IMODE(secret_file.stat().st_mode) == 0o600
        secret = auth.read(secret_file)
        nodes = children(proc.pid)
        assert len(nodes) == 3, described(nodes)
        for pid in nodes:  # given through a pipe (forked) or the environment, never argv
            assert secret.hex().encode() not in Path(f"/proc/{pid}/cmdline").read_bytes()

        intruder = run("stop", str(topo), "h1", env=ENV | {auth.ENV: auth.new().hex()})
        assert intruder.returncode == 1
        assert "refused this client" in intruder.stderr
        assert "authentication failed" in intruder.stderr
        assert len(intruder.stderr.strip().splitlines()) == 1, intruder.stderr
        assert proc.poll() is None and children(proc.pid) == nodes, described(nodes)  # h1 runs
        faults = run("link", str(topo), "sw0", "h0", "--loss", "1", env=ENV | {auth.ENV: "00" * 32})
        assert faults.returncode == 1 and "refused this client" in faults.stderr

        assert run("stop", str(topo), "h1").returncode == 0  # found beside nothing: the run file
    assert not secret_file.exists()
    assert not [pid for pid in nodes if alive(pid)], described(nodes)


def test_a_client_of_a_fabric_that_is_not_running_says_so(topo: Path) -> None:
    out = run("stop", str(topo), "h1")
    assert out.returncode == 1
    assert "no secret for the fabric" in out.stderr and "is the fabric running" in out.stderr
