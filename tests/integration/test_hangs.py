"""tests/integration/hangs.py: a command that outlives its deadline fails its test with the
stacks of its processes - the leader's and its children's - and leaves none behind."""

from __future__ import annotations

import re
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.integration.hangs import run_or_dump

pytestmark = pytest.mark.integration

HANGS = textwrap.dedent(
    """
    import subprocess, sys, time

    child = "import time\\ndef waits_forever():\\n    time.sleep(600)\\nwaits_forever()"
    pid = subprocess.Popen([sys.executable, "-c", child], stderr=sys.stderr).pid
    print("started", pid, flush=True)
    def leader_waits():
        time.sleep(600)
    leader_waits()
    """
)


def test_a_hung_command_fails_with_every_process_stack_and_leaves_nothing() -> None:
    with pytest.raises(pytest.fail.Exception) as failed:
        run_or_dump([sys.executable, "-c", HANGS], timeout=3, grace=2)
    text = str(failed.value)
    assert "did not end within 3 s" in text, text
    assert "in waits_forever" in text, text  # the child's stack, dumped by its SIGABRT
    assert "in leader_waits" in text, text  # then the leader's
    child = int(re.search(r"started (\d+)", text).group(1))  # type: ignore[union-attr]
    assert _gone(child), f"process {child} is still running"


def _gone(pid: int) -> bool:
    """``pid`` has exited (a zombie not yet reaped by init counts as gone)."""
    for _ in range(50):
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            return True
        if state == "Z":
            return True
        time.sleep(0.1)
    return False


def test_a_command_that_ends_gives_its_output_and_code() -> None:
    run = run_or_dump([sys.executable, "-c", "print('out'); raise SystemExit(3)"], timeout=60)
    assert (run.returncode, run.stdout) == (3, "out\n")
