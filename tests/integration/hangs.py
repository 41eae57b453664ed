"""A command that must end, run so that a hang explains itself.

:func:`run_or_dump` runs a command whose processes are Python (a launcher, its ranks, a
fabric's nodes) with faulthandler on (``PYTHONFAULTHANDLER``).  If it outlives its deadline,
every process of its group but the leader gets SIGABRT first - each prints every thread's
stack into the output its leader streams - then the leader itself, and what is left of the
group is killed.  The test fails with that output: a hang in CI shows where each process
waited, not only pytest's timeout.  A group has a handful of processes; the walk of
``/proc`` that finds them happens only on a hang.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest

SHOWN = 24_000  # characters of a hung command's output the failure shows (its end)


def group_members(leader: int) -> list[int]:
    """The processes of ``leader``'s process group other than ``leader``."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == leader:
            continue
        with contextlib.suppress(OSError, IndexError, ValueError):
            stat = (entry / "stat").read_text()
            # pid (comm) state ppid pgrp ...: comm may hold spaces and parentheses
            if int(stat.rsplit(")", 1)[1].split()[2]) == leader:
                members.append(int(entry.name))
    return members


def run_or_dump(
    cmd: list[str],
    timeout: float,
    env: dict[str, str] | None = None,
    grace: float = 15.0,
    **kwargs: Any,
) -> subprocess.CompletedProcess[str]:
    """``cmd`` run to its end (output captured as text), in a session of its own; past
    ``timeout`` wall seconds the test fails with every process's stacks (see the module),
    the leader given ``grace`` seconds to stream its children's before its own."""
    env = {**(env if env is not None else os.environ), "PYTHONFAULTHANDLER": "1"}
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,
        **kwargs,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        out, err = _dump_and_kill(proc, grace)
        text = f"{out}\n--- stderr ---\n{err}"
        pytest.fail(
            f"{' '.join(cmd[:6])} ... did not end within {timeout:g} s; every process's "
            f"stacks (faulthandler) follow:\n{text[-SHOWN:]}",
            pytrace=False,
        )
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def _dump_and_kill(proc: subprocess.Popen[str], grace: float) -> tuple[str, str]:
    for pid in group_members(proc.pid):
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGABRT)
    try:
        return proc.communicate(timeout=grace)  # the leader streams their dumps, then ends
    except subprocess.TimeoutExpired:
        with contextlib.suppress(OSError):
            os.kill(proc.pid, signal.SIGABRT)
    try:
        return proc.communicate(timeout=10)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(OSError):
            os.killpg(proc.pid, signal.SIGKILL)
        return proc.communicate()
