"""The process of an exact run: what it sets up before its trio run (fabric/exact_node.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]

PROCESS = """
import os
from rocev2_emu.fabric.exact_node import run_process
from rocev2_emu.runtime.sync_messages import RunOver

async def main():
    policies = {os.SCHED_OTHER: "other", os.SCHED_BATCH: "batch"}
    print(policies.get(os.sched_getscheduler(0), "something else"), flush=True)
    raise RunOver("the test's")

print(os.sched_getscheduler(0) == os.SCHED_OTHER, flush=True)
run_process(main)
"""


def test_an_exact_process_runs_under_sched_batch_so_a_grant_does_not_preempt_the_coordinator() -> (
    None
):
    """A node process of an exact run takes SCHED_BATCH before its trio run (a woken node
    must not take the coordinator's CPU between two grants), and ends normally on RunOver.
    In a child process: the test's own policy stays."""
    done = subprocess.run(
        [sys.executable, "-c", PROCESS],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", "batch"]
