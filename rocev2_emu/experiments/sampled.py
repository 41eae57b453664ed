"""One scenario run of flows in virtual time, sampled: every flow's goodput and the watched
switch port's queue, ECN marks, transmissions and pauses, every ``dt`` emulated seconds
(:class:`~rocev2_emu.experiments.runs.Run`), then the flows' results and the fabric's
counters.  A run keeps one sample per flow and one of the port per ``dt``.
"""

from __future__ import annotations

import trio

from rocev2_emu.experiments.runs import Run
from rocev2_emu.fabric.agent import FlowSpec
from rocev2_emu.fabric.flows import run_flows
from rocev2_emu.fabric.report import fabric_stats
from rocev2_emu.fabric.virtual import (
    Watcher,
    delivered,
    fabric_quiet,
    run_virtual_time,
    show_progress,
    virtual_fabric,
    watching,
)
from rocev2_emu.topology.model import Topology

G = 1e9  # bits per Gbit
START = 1e-6  # emulated seconds: when a scenario's flows start, in every mode


def host_port(topo: Topology, host: str) -> tuple[str, int]:
    """The switch port that faces ``host`` (where its incoming traffic queues)."""
    link, switch = topo.host_link(host)
    return switch.name, topo.port_of(switch.name, link)


async def _run(
    topo: Topology,
    flows: list[FlowSpec],
    watch: tuple[str, int] | str,
    dt: float,
    setting: str,
    recorder: Watcher | None = None,
) -> Run:
    run = Run(setting, [])
    at = host_port(topo, watch) if isinstance(watch, str) else watch
    async with virtual_fabric(topo) as (drivers, agents):
        show_progress(drivers, delivered(agents, flows))
        t0 = next(iter(agents.values())).ctx.now() + START
        done = trio.Event()

        async def sample() -> None:
            last = {f.id: 0 for f in flows}
            driver = drivers[at[0]]
            sw = driver.core
            port = sw.ports[at[1]]
            while not done.is_set():
                await trio.sleep(dt)
                now = driver.clock.now()
                run.times.append(now - t0)
                for f in flows:
                    received = agents[f.dst].received_bytes(f.id)
                    total = last[f.id] if received is None else received
                    run.goodput.setdefault(f.id, []).append((total - last[f.id]) * 8 / dt / G)
                    last[f.id] = total
                run.queue.append(sum(port.queue_bytes))
                run.marked.append(sum(port.ecn_marked))
                run.sent.append(port.tx_packets)
                run.paused.append(
                    any(p.paused_until[3] > now for p in sw.ports)
                    or any(any(row) for row in sw.mmu.paused)
                )

        async with trio.open_nursery() as jobs:
            if dt > 0:
                jobs.start_soon(sample)
            with watching(recorder, drivers, agents):  # the map's recorder, if any
                run.results = await run_flows(agents, flows, t0)
            done.set()
            jobs.cancel_scope.cancel()
        await fabric_quiet(agents)  # the counters once nothing can change them
        run.fabric = fabric_stats(drivers, agents)
    return run


def run_sampled(
    topo: Topology,
    flows: list[FlowSpec],
    watch: tuple[str, int] | str,
    dt: float,
    setting: str,
    recorder: Watcher | None = None,
) -> Run:
    """``flows`` in virtual time, sampling every ``dt`` emulated seconds at port ``watch`` (0:
    no samples, the flow results and counters only); ``recorder`` observes the run until the
    flows end (the map's)."""
    return run_virtual_time(topo.seed, _run, topo, flows, watch, dt, setting, recorder)
