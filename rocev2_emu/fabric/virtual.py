"""The fabric in one process, in virtual time: every switch and host on in-memory links, with
the same cores, drivers and agents as real processes, under trio's MockClock.

:func:`run_virtual_time` is the one way a virtual job runs (flows, scenarios, collective jobs):
trio's task scheduling seeded from the topology (:mod:`rocev2_emu.runtime.determinism`), a
MockClock that jumps from event to event, and so the same result for the same seed every time.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any, TypeVar

import trio
import trio.testing

from rocev2_emu.fabric.agent import FlowResult, FlowSpec, HostAgent
from rocev2_emu.fabric.flows import run_flows
from rocev2_emu.fabric.nodes import host_agent, host_config, switch_driver
from rocev2_emu.fabric.report import fabric_stats, report
from rocev2_emu.fabric.topology import Topology
from rocev2_emu.runtime.clock import DilatedClock
from rocev2_emu.runtime.determinism import seed_trio_scheduler
from rocev2_emu.runtime.ports import MemoryNetwork
from rocev2_emu.verbs.api import Context
from rocev2_emu.wire.ethernet import LINK_UDP_PORT
from switch.driver import SwitchDriver

T = TypeVar("T")


def run_virtual_time(seed: int, main: Callable[..., Awaitable[T]], *args: Any) -> T:
    """``trio.run(main, *args)`` in virtual time, its scheduling seeded with ``seed``."""
    seed_trio_scheduler(seed)
    return trio.run(main, *args, clock=trio.testing.MockClock(autojump_threshold=0))


@asynccontextmanager
async def virtual_fabric(
    topo: Topology,
) -> AsyncIterator[tuple[dict[str, SwitchDriver], dict[str, HostAgent]]]:
    """Every switch and host of ``topo`` in this process on in-memory links; use it inside
    :func:`run_virtual_time`."""
    net = MemoryNetwork()
    drivers: dict[str, SwitchDriver] = {}
    agents: dict[str, HostAgent] = {}
    async with trio.open_nursery() as nursery, AsyncExitStack() as stack:
        for sw in topo.switches:
            port = net.port((sw.address, LINK_UDP_PORT))
            drivers[sw.name] = switch_driver(topo, sw.name, port, DilatedClock(1.0))
            await nursery.start(drivers[sw.name].run)
        for h in topo.hosts:
            cfg = host_config(topo, h.name, 1.0, None, seeded=True)
            assert cfg.link_peer is not None
            port = net.port((h.address, LINK_UDP_PORT), cfg.link_peer)
            ctx = await stack.enter_async_context(Context.open(cfg, port=port))
            agents[h.name] = host_agent(topo, ctx, h.name)
        try:
            yield drivers, agents
        finally:
            nursery.cancel_scope.cancel()


async def _flows(topo: Topology, flows: list[FlowSpec]) -> tuple[list[FlowResult], dict[str, Any]]:
    async with virtual_fabric(topo) as (drivers, agents):
        t0 = next(iter(agents.values())).ctx.now() + 1e-3
        results = await run_flows(agents, flows, t0)
        return results, fabric_stats(drivers, agents)


def run_virtual(topo: Topology, flows: list[FlowSpec]) -> int:
    """``rocev2-emu up --virtual``: the flows in virtual time, then the report."""
    results, fabric = run_virtual_time(topo.seed, _flows, topo, flows)
    return report(topo, 1.0, "virtual time (one process, in-memory links)", results, fabric)
