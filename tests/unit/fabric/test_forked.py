"""Node processes forked before the run (rocev2_emu/fabric/forked.py): a blank runs the command
line it is given as ``python -m rocev2_emu`` would, with its own output pipes and exit code;
blanks nobody takes end when closed; a started one takes the name it is given (its first 15
characters) and is stopped by a signal."""

from __future__ import annotations

import os
import shutil
import signal
import time
from pathlib import Path

import pytest
import trio

from rocev2_emu import cores
from rocev2_emu.fabric.forked import Blanks, ForkedProcess

EXAMPLES = Path(__file__).parents[3] / "examples"


async def _read_all(stream: trio.abc.ReceiveStream | None) -> str:
    assert stream is not None
    out = b""
    with trio.fail_after(60):
        while chunk := await stream.receive_some(65536):
            out += chunk
    return out.decode()


def _start(blanks: Blanks, argv: list[str]) -> ForkedProcess:
    proc = blanks.start(argv, dict(os.environ), "a-test-blank-long-name")
    assert proc is not None
    return proc


def _wait_named(pid: int, name: str) -> None:
    deadline = time.monotonic() + 30
    while Path(f"/proc/{pid}/comm").read_text() != name + "\n":
        assert time.monotonic() < deadline, f"process {pid} never took the name {name}"
        time.sleep(0.01)


async def test_a_blank_runs_the_command_line_it_is_given() -> None:
    with Blanks(1) as blanks:
        assert len(blanks) == 1
        proc = _start(blanks, ["--version"])
        assert blanks.start(["--version"], {}, "none") is None  # the one blank is taken
        out, err = await _read_all(proc.stdout), await _read_all(proc.stderr)
        with trio.fail_after(60):
            assert await proc.wait() == 0
    assert cores.describe() in out  # what `python -m rocev2_emu --version` prints
    assert err == ""


async def test_a_failing_command_says_why_on_its_own_stderr_and_exit_code(
    tmp_path: Path,
) -> None:
    missing = str(tmp_path / "missing.toml")
    with Blanks(1) as blanks:
        proc = _start(blanks, ["node", missing, "h0"])
        err = await _read_all(proc.stderr)
        with trio.fail_after(60):
            assert await proc.wait() == 1
    assert "rocev2-emu node: error:" in err and "missing.toml" in err


def test_blanks_nobody_takes_end_when_closed() -> None:
    blanks = Blanks(3)
    pids = [blank.pid for blank in blanks._free]
    assert len(pids) == 3
    blanks.close()  # waits for them
    assert len(blanks) == 0
    for pid in pids:
        with pytest.raises(ChildProcessError):  # reaped by close(): it ended
            os.waitpid(pid, os.WNOHANG)


async def test_a_started_blank_is_stopped_by_terminate(tmp_path: Path) -> None:
    topology = tmp_path / "leaf-spine.toml"  # a copy: a node started by hand makes its secret
    shutil.copy(EXAMPLES / "topologies" / "leaf-spine.toml", topology)
    with Blanks(1) as blanks:
        # a node that waits up to 50 s for a coordinator that never listens
        argv = ["node", str(topology), "spine0", "--clock", "exact", "--sync", "/nonexistent/s"]
        proc = _start(blanks, [*argv, "--join-timeout", "50", "--no-metrics"])
        # it has read its command once it has taken its name
        await trio.to_thread.run_sync(_wait_named, proc.pid, "a-test-blank-lo")
        proc.terminate()
        with trio.fail_after(30):
            assert await proc.wait() == -signal.SIGTERM
        proc.kill()  # reaped already: a no-op, never a signal to a reused pid
