"""Starting a fabric's node processes and reading what they say: the ``rocev2-emu node``
arguments of each, a blank forked before the run or a fresh interpreter, their READY lines
(within :func:`ready_deadline`), their pipes kept flowing with the last lines remembered, and
the line that says why one left.  One pipe task per process; a tail of a few lines each.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections import deque

import trio
import trio.abc

from rocev2_emu.fabric.forked import Blanks, NodeProcess
from rocev2_emu.runtime.sync import SyncAddress, sync_label
from rocev2_emu.runtime.sync_messages import process_label

READY_TIMEOUT = 60.0  # wall seconds for a fabric's node processes to say READY, and
READY_PER_NODE = 0.01  # as many more per node of the fabric: every process reads the whole
# file and builds its nodes on cores the others share (26 274 nodes on six workers: 5 min)


def ready_deadline(processes: list[str]) -> float:
    """Wall seconds the node processes ``processes`` (each named by its nodes) have to be
    ready: :data:`READY_TIMEOUT`, and :data:`READY_PER_NODE` for every node they host."""
    return READY_TIMEOUT + READY_PER_NODE * sum(name.count(",") + 1 for name in processes)


async def read_ready(name: str, proc: NodeProcess, ready: dict[str, str]) -> None:
    """The READY line of each node of process ``name`` (its nodes, comma-separated)."""
    assert proc.stdout is not None
    nodes = name.split(",")
    buf = b""
    while buf.count(b"\n") < len(nodes):
        chunk = await proc.stdout.receive_some(4096)
        if not chunk:
            raise RuntimeError(
                f"node {process_label(name)} exited before it was ready (code {proc.poll()})"
            )
        buf += chunk
    for line in buf.decode().splitlines()[: len(nodes)]:
        if not line.startswith("READY ") or line.split()[1] not in nodes:
            raise RuntimeError(f"node {process_label(name)} said {line!r} instead of READY")
        ready[line.split()[1]] = line


async def drain(stream: trio.abc.ReceiveStream | None, tail: deque[str]) -> None:
    """Keep a node's pipe flowing (a full pipe would stall it) and remember its last lines."""
    if stream is None:
        return
    while chunk := await stream.receive_some(65536):
        tail.extend(chunk.decode(errors="replace").splitlines())


def node_argv(
    topo_path: str,
    name: str,
    tdf: float,
    epoch: float,
    sync: SyncAddress | None = None,
    workers: int | None = None,
    payload: str = "real",
) -> list[str]:
    """The ``rocev2-emu`` arguments of node process ``name``."""
    exact = [] if sync is None else ["--clock", "exact", "--sync", sync_label(sync)]
    if workers is not None:
        exact += ["--workers", str(workers)]
    if payload != "real":  # (--payload none: the run's, which the file may not say)
        exact += ["--payload", payload]
    return [
        "node",
        topo_path,
        name,
        "--tdf",
        str(tdf),
        "--epoch",
        repr(epoch),
        "--parent-pid",
        str(os.getpid()),
        *exact,
    ]


async def start_node(
    argv: list[str], env: dict[str, str], blanks: Blanks | None, name: str
) -> NodeProcess:
    """Node process ``name``, ``rocev2-emu ARGV``: a blank forked before the run if one is
    left (:mod:`~rocev2_emu.fabric.forked`; named ``name``), else a new ``python -m rocev2_emu``."""
    forked = None if blanks is None else blanks.start(argv, env, name)
    if forked is not None:
        return forked
    return await trio.lowlevel.open_process(
        [sys.executable, "-m", "rocev2_emu", *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )


async def wait_ready(procs: dict[str, NodeProcess], tails: dict[str, deque[str]]) -> dict[str, str]:
    ready: dict[str, str] = {}
    deadline = ready_deadline(list(procs))
    try:
        with trio.fail_after(deadline):
            async with trio.open_nursery() as waiting:
                for name, proc in procs.items():
                    waiting.start_soon(read_ready, name, proc, ready)
    except (trio.TooSlowError, ExceptionGroup) as exc:  # not Ctrl-C: that goes up as it is
        await trio.sleep(0.3)
        missing = sorted(set(procs) - set(ready))
        for name in missing:
            print(
                f"rocev2-emu up: node {process_label(name)} not ready: " + " | ".join(tails[name]),
                file=sys.stderr,
            )
        shown = [process_label(name) for name in missing]
        raise RuntimeError(f"nodes not ready within {deadline:g} s: {shown}") from exc
    return ready


async def last_words(proc: NodeProcess, tail: deque[str]) -> str:
    """The last error line node process ``proc`` wrote on stderr (its tail so far, and what
    it writes until its pipe closes, at most two seconds): the line that names why it left."""
    if proc.stderr is not None:
        with trio.move_on_after(2):
            while chunk := await proc.stderr.receive_some(65536):
                tail.extend(chunk.decode(errors="replace").splitlines())
    lines = [line.strip() for line in tail if line.strip()]
    said = [line for line in lines if line.startswith("rocev2-emu")]
    return (said or lines or [""])[-1]
