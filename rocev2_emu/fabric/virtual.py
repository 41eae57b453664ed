"""The fabric in one process, in virtual time: every switch and host a node of one
discrete-event engine (:mod:`rocev2_emu.runtime.engine`), with the same cores and agents as
real processes, under trio's MockClock.

:func:`run_virtual_time` is the one way a virtual job runs (flows, scenarios, collective jobs):
trio's task scheduling seeded from the topology (:mod:`rocev2_emu.runtime.determinism`), a
MockClock that jumps from event to event, and so the same result for the same seed every time.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import AsyncExitStack, asynccontextmanager, contextmanager
from typing import Any, TypeVar

import trio
import trio.testing

from rocev2_emu.fabric.agent import FlowResult, FlowSpec, HostAgent
from rocev2_emu.fabric.engine_nodes import build_nodes
from rocev2_emu.fabric.flows import run_flows
from rocev2_emu.fabric.report import fabric_stats
from rocev2_emu.nic.driver import EngineNic
from rocev2_emu.runtime.collector import engine_collector
from rocev2_emu.runtime.determinism import canonical_trio_scheduler
from rocev2_emu.runtime.engine import Engine
from rocev2_emu.runtime.progress import ProgressLine
from rocev2_emu.topology.model import Topology
from switch.driver import EngineSwitch

T = TypeVar("T")


def run_virtual_time(seed: int, main: Callable[..., Awaitable[T]], *args: Any) -> T:
    """``trio.run(main, *args)`` in virtual time; tasks that wake together run in the order they
    were created (:func:`~rocev2_emu.runtime.determinism.canonical_trio_scheduler`); ``seed``
    is the topology's, which seeds the cores and links."""
    canonical_trio_scheduler()
    with engine_collector():
        return trio.run(main, *args, clock=trio.testing.MockClock(autojump_threshold=0))


def engine_seconds() -> float:
    """Wall seconds this process's event engines have spent running events so far
    (:attr:`Engine.running_seconds`): a benchmark's reading before and after a run."""
    return Engine.running_seconds


@asynccontextmanager
async def virtual_fabric(
    topo: Topology,
) -> AsyncIterator[tuple[dict[str, EngineSwitch], dict[str, HostAgent]]]:
    """Every switch and host of ``topo`` in this process, as nodes of one event engine
    (:mod:`rocev2_emu.runtime.engine`); use it inside :func:`run_virtual_time`."""
    engine = Engine()
    engine.progress = line = ProgressLine.on_terminal()
    async with trio.open_nursery() as nursery, AsyncExitStack() as contexts:
        built = await build_nodes(topo, None, engine, contexts)
        switches, agents = built.switches, built.agents
        await nursery.start(engine.run)
        try:
            yield switches, agents
        finally:
            nursery.cancel_scope.cancel()
            if line is not None:
                line.close()


async def fabric_quiet(agents: dict[str, HostAgent]) -> None:
    """Until the virtual fabric is quiet (no frame in flight, no core deadline): a job's
    counters are read then, the same instant as an exact run over processes reads them."""
    driver = next(iter(agents.values())).ctx.driver
    assert isinstance(driver, EngineNic)
    await driver.engine.wait_quiet()


def delivered(agents: dict[str, HostAgent], flows: list[FlowSpec]) -> Callable[[], float]:
    """The fraction of the flows' bytes delivered so far (for the progress line's ETA)."""
    total = sum(f.size for f in flows) or 1
    done: dict[int, int] = {}  # a finished flow's inbound state is gone: keep its bytes

    def fraction() -> float:
        for f in flows:
            got = agents[f.dst].received_bytes(f.id)
            if got is not None:
                done[f.id] = got
        return sum(done.values()) / total

    return fraction


def show_progress(drivers: dict[str, EngineSwitch], fraction: Callable[[], float]) -> None:
    """Give the run's progress line (if any) a way to tell how far along the run is."""
    first = next(iter(drivers.values()), None)
    if first is not None and isinstance(first.engine.progress, ProgressLine):
        first.engine.progress.fraction = fraction


Beside = Callable[[dict[str, Any], dict[str, Any]], Awaitable[None]]
# An observer of a virtual run, not a task: called with (switches, agents) once the fabric is
# up, it registers with the engine (Engine.watch) and returns what to call when the run ends.
# Being no trio task, it cannot change the run (the map's recorder).
Watcher = Callable[[dict[str, Any], dict[str, Any]], Callable[[], None]]


@contextmanager
def watching(
    watch: Watcher | None, switches: dict[str, Any], agents: dict[str, Any]
) -> Iterator[None]:
    """``watch`` on the fabric for the length of the block (nothing if None)."""
    finish = watch(switches, agents) if watch is not None else None
    try:
        yield
    finally:
        if finish is not None:
            finish()


async def _flows(
    topo: Topology,
    flows: list[FlowSpec],
    watch: Watcher | None = None,
    beside: Beside | None = None,
) -> tuple[list[FlowResult], dict[str, Any]]:
    async with virtual_fabric(topo) as (drivers, agents), trio.open_nursery() as nursery:
        show_progress(drivers, delivered(agents, flows))
        t0 = next(iter(agents.values())).ctx.now() + 1e-3
        if beside is not None:
            nursery.start_soon(beside, drivers, agents)
        with watching(watch, drivers, agents):
            results = await run_flows(agents, flows, t0)
            await fabric_quiet(agents)
        nursery.cancel_scope.cancel()
        return results, fabric_stats(drivers, agents)


def run_flows_virtual(
    topo: Topology,
    flows: list[FlowSpec],
    watch: Watcher | None = None,
    beside: Beside | None = None,
) -> tuple[list[FlowResult], dict[str, Any]]:
    """``flows`` on ``topo`` in virtual time: their results and the fabric's counters;
    ``watch``: an observer of the run until the flows end (the map's recorder); ``beside``: a
    task alongside the flows (a link failing at an instant,
    :func:`~rocev2_emu.fabric.changes.change_links_at`)."""
    return run_virtual_time(topo.seed, _flows, topo, flows, watch, beside)
