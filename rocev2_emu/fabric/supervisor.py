"""The local supervisor: one ``rocev2-emu node`` process per switch and host, each on its own
127.10.x.y address, and a job run on them.

It starts every node, waits until each prints READY (with a deadline), prints where each
serves metrics, then runs a :class:`FabricJob` (or waits for Ctrl-C), and stops every node on
the way out.  If a node dies it asks the job whether it can go on (a collective job can: its
other ranks raise); otherwise it says which node died and why (its last stderr lines) and
stops the rest.  A fabric left running with no job keeps its other nodes when one stops or
crashes (``rocev2-emu stop``), as a real fabric would.  ``rocev2-emu up`` is
:func:`rocev2_emu.fabric.flow_run.up`.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections import deque
from collections.abc import Awaitable, Callable, Collection
from functools import partial
from typing import Any, Protocol

import trio
import trio.abc

from rocev2_emu.control import auth
from rocev2_emu.fabric import blocks
from rocev2_emu.fabric.forked import Blanks, NodeProcess
from rocev2_emu.fabric.layout import lookahead
from rocev2_emu.fabric.node_procs import drain, last_words, node_argv, start_node, wait_ready
from rocev2_emu.fabric.options import Clock, RunOptions
from rocev2_emu.runtime.coordinator import Coordinator
from rocev2_emu.runtime.sync_messages import SyncError, process_label
from rocev2_emu.topology.model import Topology, refuse_split_servers
from rocev2_emu.topology.processes import process_groups, process_name
from rocev2_emu.wire.ethernet import LINK_UDP_PORT


class FabricJob(Protocol):
    """What runs on a fabric of node processes once every node is ready."""

    async def run(self, topo: Topology, tdf: float, epoch: float) -> Any: ...

    async def node_died(self, name: str, code: int) -> bool:
        """Told that a node died; True if the job copes (else the fabric stops)."""
        ...


async def _watch(
    name: str,
    proc: NodeProcess,
    tail: deque[str],
    stopping: trio.Event,
    scope: trio.CancelScope,
    job: FabricJob | None,
    coordinator: Coordinator | None = None,
) -> None:
    code = await proc.wait()
    if coordinator is not None and coordinator.finished:
        return  # the exact run has ended: its nodes exit on their own
    if not stopping.is_set():
        await trio.sleep(0.2)  # let the drain task collect the last words
        if stopping.is_set() or (coordinator is not None and coordinator.finished):
            return  # the job ended meanwhile
        why = "\n".join(tail)
        if job is None:  # a fabric left running: the others go on, as in a real fabric
            how = "stopped" if code == -signal.SIGTERM else f"died with code {code}"
            print(
                f"rocev2-emu up: node {name} {how}; the rest of the fabric runs on"
                + (f"\n{why}" if why and code != -signal.SIGTERM else ""),
                file=sys.stderr,
                flush=True,
            )
            return
        if await job.node_died(name, code):
            print(f"rocev2-emu: node {name} died with code {code}", file=sys.stderr)
            return
        print(
            f"rocev2-emu up: node {name} died with code {code}; stopping the fabric"
            + (f"\n{why}" if why else ""),
            file=sys.stderr,
        )
        scope.cancel()


class NodeDied(RuntimeError):
    """A node of a wall-clock run died and its job could not go on (the supervisor has said
    which, with its last words)."""


class FabricBusy(RuntimeError):
    """A node's address is taken: a fabric on the same addresses runs already."""


def refuse_taken(topo: Topology, topo_path: str, names: Collection[str]) -> None:
    """Before any node starts: every node's link port (UDP ``LINK_UDP_PORT`` on its address)
    must be free; else FabricBusy, one line naming the first address taken - a second ``up``
    of a running fabric is refused before it starts anything."""
    name = blocks.first_taken(topo, names)
    if name is not None:
        raise FabricBusy(
            f"{topo.nodes[name].address}:{LINK_UDP_PORT} ({name} of {topo_path}) is in use: a "
            "fabric on these addresses is running already; end it first (Ctrl-C where it runs)"
        )


async def _supervise(
    topo: Topology,
    topo_path: str,
    tdf: float,
    job: FabricJob | None,
    quiet: bool = False,
    only: Collection[str] | None = None,
    beside: Callable[..., Awaitable[None]] | None = None,
    coordinator: Coordinator | None = None,
    workers: int | None = None,
    blanks: Blanks | None = None,
) -> Any:
    """Start every node (``only``: these), run ``job`` (or wait for Ctrl-C), stop; the job's
    outcome (None when a node died and the job could not go on).  ``beside``: a task started
    (``nursery.start``) once the nodes are ready, cancelled when the job ends (the map).
    ``coordinator``: an exact run - it is served here and every node synchronises with it;
    ``workers``: its nodes in that many processes
    (:func:`~rocev2_emu.topology.processes.process_groups`) rather than one each; ``blanks``:
    forked children to run them in (:func:`_supervised`)."""
    names = [n for n in topo.nodes if only is None or n in only]
    # a run takes its own 127.B/16 where one is free; a fabric left running (no job) looks
    # first where its topology's run says it runs, so a second one is refused, not started
    block = blocks.take(topo, topo_path, names, own_first=job is None)
    refuse_taken(topo, topo_path, names)
    if coordinator is None:
        refuse_split_servers(topo, None if only is None else list(only))
    epoch = time.monotonic()
    procs: dict[str, NodeProcess] = {}
    stopping = trio.Event()
    outcome: Any = None
    secret, created = auth.load_or_create(topo_path)
    auth.use(secret)  # the job's own requests prove it too
    env = {**os.environ, auth.ENV: secret.hex()}  # the environment, not argv: ps shows argv
    if block is not None:
        env[blocks.ENV] = str(block)
        if block != blocks.FIRST:
            print(
                f"# {topo.name}: on 127.{block}.0.0/16 (127.{blocks.FIRST}: another fabric runs "
                "there)",
                file=sys.stderr,
                flush=True,
            )
    tails: dict[str, deque[str]] = {}
    try:
        async with trio.open_nursery() as nursery:
            sync = None
            if coordinator is not None:
                coordinator.secret = secret
                sync = await nursery.start(partial(coordinator.serve, local=True))
            for name in _process_names(topo, only, coordinator is not None, workers):
                argv = node_argv(topo_path, name, tdf, epoch, sync, workers, topo.payload)
                procs[name] = await start_node(argv, env, blanks, name)
                tails[name] = deque(maxlen=8)
                nursery.start_soon(drain, procs[name].stderr, tails[name])
            ready = await wait_ready(procs, tails)
            for name, proc in procs.items():
                nursery.start_soon(drain, proc.stdout, deque(maxlen=1))
                nursery.start_soon(
                    _watch,
                    name,
                    proc,
                    tails[name],
                    stopping,
                    nursery.cancel_scope,
                    job,
                    coordinator,
                )
            if not quiet:
                clock = "clock: exact" if coordinator is not None else f"clock: wall, TDF {tdf:g}"
                nodes = [n for n in topo.nodes if n in ready]
                many = f" ({len(nodes)} nodes)" if len(nodes) != len(procs) else ""
                print(f"# {topo.name}: {len(procs)} node processes{many} ready, {clock}")
                for name in nodes:
                    print(f"  {name:>10}  {ready[name].split(' ', 2)[2]}")
            if beside is not None:
                await nursery.start(beside)
            if job is None:
                print("# Ctrl-C stops the fabric", flush=True)
                await trio.sleep_forever()
            else:
                try:
                    outcome = await job.run(topo, tdf, epoch)
                except Exception as exc:  # re-raised, or an error naming a process that died
                    raise await _named_death(procs, exc) from exc
            stopping.set()
            nursery.cancel_scope.cancel()
    except BaseException as exc:
        blamed = _blamed(exc)
        if blamed is None or blamed.node not in procs:
            raise
        words = await last_words(procs[blamed.node], tails[blamed.node])
        if not words:
            raise
        raise SyncError(f"{blamed}; it said: {words}", blamed.node) from exc
    finally:
        stopping.set()
        await _stop(procs)
        blocks.release(topo_path, block)
        if created is not None:
            created.unlink(missing_ok=True)  # the fabric is gone; so is the secret it made
    return outcome


def _blamed(exc: BaseException) -> SyncError | None:
    """The SyncError inside ``exc`` that blames a node process, if any."""
    if isinstance(exc, SyncError):
        return exc if exc.node is not None else None
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            if (found := _blamed(inner)) is not None:
                return found
    return None


def _process_names(
    topo: Topology, only: Collection[str] | None, exact: bool, workers: int | None
) -> list[str]:
    """The node processes :func:`_supervise` starts (each named by its nodes)."""
    names = map(process_name, process_groups(topo, workers if exact else None))
    return [name for name in names if only is None or name in only]


def _supervised(
    run: Callable[..., Any],
    topo: Topology,
    topo_path: str,
    tdf: float,
    job: FabricJob | None,
    quiet: bool,
    only: Collection[str] | None = None,
    beside: Callable[..., Awaitable[None]] | None = None,
    coordinator: Coordinator | None = None,
    workers: int | None = None,
) -> Any:
    """``run(_supervise, ...)`` (``trio.run``, or :func:`run_synced`) with a blank child
    forked for each node process before the event loop starts."""
    count = len(_process_names(topo, only, coordinator is not None, workers))
    with Blanks(count) as blanks:
        return run(
            _supervise, topo, topo_path, tdf, job, quiet, only, beside, coordinator, workers, blanks
        )


async def _named_death(procs: dict[str, NodeProcess], exc: Exception) -> Exception:
    """``exc``, a job's failed request; or, when a node process ended (the request failed as
    it died: a ``stop``, a crash), an error naming the process, which is what the user needs."""
    with trio.move_on_after(2) as waiting:  # its exit may be a moment behind its connections

        async def ended(proc: NodeProcess) -> None:
            await proc.wait()
            waiting.cancel()

        async with trio.open_nursery() as nursery:
            for proc in procs.values():
                nursery.start_soon(ended, proc)
    for name, proc in procs.items():
        code = proc.poll()
        if code is not None:
            why = first_exception(exc)  # (not a group's "Exceptions from Trio nursery")
            return RuntimeError(
                f"node {process_label(name)} died with code {code} during the job ({why})"
            )
    return exc


async def _stop(procs: dict[str, NodeProcess]) -> None:
    for proc in procs.values():
        if proc.returncode is None:
            proc.terminate()
    with trio.move_on_after(10):
        for proc in procs.values():
            await proc.wait()
    for proc in procs.values():
        if proc.returncode is None:
            proc.kill()


def run_processes(
    topo: Topology,
    topo_path: str,
    tdf: float,
    job: FabricJob | None,
    *,
    quiet: bool = True,
    only: Collection[str] | None = None,
    beside: Callable[..., Awaitable[None]] | None = None,
) -> Any:
    """One process per node on the wall clock dilated by ``tdf`` (``only``: for these nodes;
    the job runs the others), ``job``, then stop; what the job returned (None: a node died and
    the job could not go on).  No job: the fabric runs until Ctrl-C or every node stopped.
    ``beside``: a task alongside once the nodes are ready (the map of ``--ui``)."""
    return _supervised(trio.run, topo, topo_path, tdf, job, quiet, only, beside)


def run_on_processes(
    topo: Topology,
    topo_path: str,
    options: RunOptions,
    make_job: Callable[[Coordinator | None], FabricJob],
    *,
    quiet: bool = True,
    beside: Callable[..., Awaitable[None]] | None = None,
    only: Collection[str] | None = None,
) -> tuple[Any, str]:
    """The job ``make_job(coordinator)`` on node processes on the options' clock, and its
    outcome.  Exact: one process per node (or the options' ``workers`` processes, each a group
    of nodes), synchronised by a coordinator served here and paced by the options; the outcome
    comes with how the run was synchronised
    (:meth:`~rocev2_emu.runtime.sync.Coordinator.summary`), and a SyncError (one line) says why
    a run could not go on (a node died or went silent).  Wall: None for the coordinator,
    :func:`run_processes` at the options' dilation, "" for the summary, NodeDied when a node
    died.  ``only``: the processes of these nodes; the job starts the others (a torch rank's).
    A terminal on stderr gets the progress line."""
    if options.clock is Clock.EXACT:
        coordinator = coordinator_for(topo, b"", pace=options.pace, workers=options.workers)
        job = make_job(coordinator)
        args = (topo, topo_path, 1.0, job, quiet, only, beside, coordinator, options.workers)
        outcome = _supervised(run_synced, *args)
        if outcome is None:
            raise SyncError("a node died during the job")
        return outcome, coordinator.summary()
    tdf = options.dilation(topo.tdf)
    job = make_job(None)
    outcome = run_processes(topo, topo_path, tdf, job, quiet=quiet, only=only, beside=beside)
    if outcome is None:
        raise NodeDied("a node died during the job")
    return outcome, ""


def coordinator_for(
    topo: Topology, secret: bytes, *, pace: float | None = None, workers: int | None = None
) -> Coordinator:
    """The coordinator of an exact run of ``topo`` (one process per node, or ``workers``
    processes), proving ``secret``; a terminal on stderr gets its progress line."""
    terminal = sys.stderr if sys.stderr.isatty() else None
    names = [process_name(g) for g in process_groups(topo, workers)]
    return Coordinator(names, lookahead(topo), secret, pace=pace, progress=terminal)


def run_synced(main: Callable[..., Awaitable[Any]], *args: Any) -> Any:
    """``trio.run(main, *args)`` for the side of an exact run that serves its coordinator: a
    SyncError anywhere inside (a node died or went silent) comes out as one SyncError, its
    line, whatever groups trio wrapped it in."""
    try:
        return trio.run(main, *args)
    except BaseExceptionGroup as group:
        sync = group.subgroup(SyncError)
        if sync is None:
            raise
        raise SyncError(str(first_exception(sync))) from None


def first_exception(exc: BaseException) -> BaseException:
    """The first exception inside ``exc`` (itself when it is no group), however nested."""
    while isinstance(exc, BaseExceptionGroup):
        exc = exc.exceptions[0]
    return exc
