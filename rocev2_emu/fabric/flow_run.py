"""A flows job, written once for every clock: ``rocev2-emu up --flows``, the scenarios' runs
with processes, ``bench virtual``'s flow cases.

:func:`run_flow_job` takes the run's :class:`~rocev2_emu.fabric.options.RunOptions` and runs
the flows on one event engine (virtual, :func:`~rocev2_emu.fabric.flows.run_flows`), or as
one :class:`~rocev2_emu.fabric.flows.FlowsJob` on node processes synchronised on emulated time
(exact) or on the dilated wall clock (wall).  The virtual and exact runs give
the same results and counters byte for byte.  :func:`up` is the command.
"""

from __future__ import annotations

import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from rocev2_emu.fabric.agent import FlowResult, FlowSpec
from rocev2_emu.fabric.flows import FLOW_START, FlowsJob, load_flows
from rocev2_emu.fabric.layout import process_layout
from rocev2_emu.fabric.options import Clock, RunOptions
from rocev2_emu.fabric.report import report, write_json
from rocev2_emu.fabric.supervisor import NodeDied, run_on_processes, run_processes
from rocev2_emu.fabric.virtual import Watcher, run_flows_virtual
from rocev2_emu.runtime.sync_messages import SyncError
from rocev2_emu.topology.model import Topology, TopologyError


@dataclass(frozen=True, slots=True)
class FlowRun:
    """What a flows job gives: each flow's result, the fabric's counters, and for an exact run
    how it was synchronised (:meth:`~rocev2_emu.runtime.coordinator.Coordinator.summary`)."""

    results: list[FlowResult]
    fabric: dict[str, Any]
    synced: str = ""


def describe(topo: Topology, options: RunOptions) -> str:
    """Where and on which clock a run of ``topo`` runs, in words (a report's header)."""
    if options.clock is Clock.VIRTUAL:
        return "virtual time (one process, one event engine)"
    if options.clock is Clock.EXACT:
        paced = f", paced at {options.pace:g} wall s per emulated s" if options.pace else ""
        return f"{process_layout(topo, options.workers)}, clock: exact{paced}"
    return f"one process per node, clock: wall, TDF {options.dilation(topo.tdf):g}"


def run_flow_job(
    topo: Topology,
    topo_path: str,
    flows: list[FlowSpec],
    options: RunOptions,
    *,
    t0: float = FLOW_START,
    beside: Callable[..., Awaitable[None]] | None = None,
    watch: Watcher | None = None,
    quiet: bool = True,
) -> FlowRun:
    """``flows`` on ``topo`` on the options' clock, started at emulated ``t0`` (virtual time:
    1 ms, as the exact run's default).  ``beside``: a task alongside the node processes (the
    live map); ``watch``: an observer of a virtual run (the map's recorder); ``quiet=False``
    lists the node processes.  A node that dies ends the run with an error naming it."""
    if options.clock is Clock.VIRTUAL:
        results, fabric = run_flows_virtual(topo, flows, watch)
        return FlowRun(results, fabric)
    (results, fabric), synced = run_on_processes(
        topo,
        topo_path,
        options,
        lambda coordinator: FlowsJob(flows, t0, coordinator),
        quiet=quiet,
        beside=beside,
    )
    return FlowRun(results, fabric, synced)


def up(
    topo: Topology,
    topo_path: str,
    options: RunOptions,
    *,
    flows_path: str | None = None,
    beside: Callable[..., Awaitable[None]] | None = None,
    watch: Watcher | None = None,
    json_out: str | None = None,
) -> int:
    """``rocev2-emu up``: the fabric and its flows on the options' clock, then the report
    (``json_out``: and the JSON); without flows, a wall-clock fabric left running until
    Ctrl-C.  ``beside``: a task alongside the node processes (the map of ``--ui``);
    ``watch``: an observer of a virtual run (the recorder of ``--record``)."""
    flows = load_flows(flows_path, topo) if flows_path else None
    if flows is None:
        if options.clock is not Clock.WALL:
            raise TopologyError(
                f"--clock {options.clock} needs --flows: such a fabric only lives for a job"
            )
        return _left_running(topo, topo_path, options, beside)
    try:
        run = run_flow_job(topo, topo_path, flows, options, beside=beside, watch=watch, quiet=False)
    except SyncError as exc:
        print(f"rocev2-emu up: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except BaseExceptionGroup as group:
        if group.subgroup(KeyboardInterrupt) is not None:
            print("rocev2-emu up: stopped", file=sys.stderr)
            return 130  # Ctrl-C: every node has been stopped on the way out
        raise
    except NodeDied:
        return 1  # the supervisor said which node, and why
    write_json(json_out, run.results, run.fabric, topo)
    where = describe(topo, options)
    if run.synced:
        where += f" ({run.synced})"
    return report(topo, where, run.results, run.fabric)


def _left_running(
    topo: Topology,
    topo_path: str,
    options: RunOptions,
    beside: Callable[..., Awaitable[None]] | None,
) -> int:
    """A wall-clock fabric with no job, until Ctrl-C (or every node stopped)."""
    try:
        tdf = options.dilation(topo.tdf)
        run_processes(topo, topo_path, tdf, None, quiet=False, beside=beside)
    except KeyboardInterrupt:
        return 130
    except BaseExceptionGroup as group:
        if group.subgroup(KeyboardInterrupt) is not None:
            print("rocev2-emu up: stopped", file=sys.stderr)
            return 130
        raise
    return 0
