"""A collective job on a fabric of real processes: the launcher's side.

The launcher (``rocev2-emu bench all-reduce``, the tests) starts one process per node
(:func:`rocev2_emu.fabric.supervisor.run_processes`), serves the rendezvous
(:class:`StoreServer`), asks every host to run its ranks of the job (the host agent's
``collective`` command), and collects each rank's result and the fabric's counters.  Like
torchrun's agent it watches the node processes: when a host dies it posts an abort through the
store naming the host and its ranks, so the surviving ranks raise at once instead of waiting
out their deadlines.

A scenario's job runs either way: :func:`run_topology_data` with processes (the live map beside
it on ``--ui``), :func:`run_recorded` in virtual time (recorded for the map's replay).
"""

from __future__ import annotations

import math
import secrets
import socket
import tempfile
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import trio
from prometheus_client import CollectorRegistry

from collectives.comm.metrics import HostCollectiveMetrics
from collectives.comm.store import StoreServer
from collectives.jobs.job import run_virtual
from collectives.jobs.places import host_places
from rocev2_emu.experiments.harness import Mode, with_payload_data
from rocev2_emu.fabric.agent import CONTROL_PORT, FlowSpec
from rocev2_emu.fabric.control import attach, control
from rocev2_emu.fabric.exact import Coordinator
from rocev2_emu.fabric.handle import ExactFabric
from rocev2_emu.fabric.options import Clock, RunOptions
from rocev2_emu.fabric.report import merge_stats, stats_delta
from rocev2_emu.fabric.supervisor import (
    FabricJob,
    coordinator_for,
    run_on_processes,
    run_synced,
)
from rocev2_emu.topology.file import parse
from rocev2_emu.topology.generate import to_toml
from rocev2_emu.topology.model import NodeKind, Topology
from rocev2_emu.verbs import OobChannel, fabric_secret


class CollectiveJob:
    def __init__(
        self,
        name: str,
        params: dict[str, Any],
        store_host: str = "127.0.0.1",
        bind_host: str | None = None,
    ) -> None:
        self.name = name
        self.params = {"job_id": secrets.token_hex(4), **params}
        self.store_host = store_host  # where hosts reach the store
        self.server = StoreServer(bind_host or store_host, 0)
        self.dead: set[str] = set()
        self.died: dict[str, trio.Event] = {}
        self.topo: Topology | None = None

    async def run(
        self, topo: Topology, tdf: float, epoch: float
    ) -> tuple[dict[int, Any], dict[str, Any]]:
        self.topo = topo
        self.died = {name: trio.Event() for name in topo.nodes}
        results: dict[int, Any] = {}
        before = await self._stats(topo)  # a fabric that ran before: report this job's share
        async with trio.open_nursery() as nursery:
            port = await nursery.start(self.server.serve)

            async def host(name: str, address: str) -> None:
                chan = await OobChannel.connect(
                    address, CONTROL_PORT, timeout=30, secret=fabric_secret()
                )
                chan.timeout = math.inf  # the job's own deadlines bound it
                try:
                    await chan.send(
                        {
                            "cmd": "collective",
                            "name": self.name,
                            "params": self.params,
                            "store": [self.store_host, port],
                        }
                    )
                    reply = await chan.recv()
                except Exception as exc:  # the host died under us (its watcher will say so)?
                    with trio.move_on_after(2.0):
                        await self.died[name].wait()
                    if name in self.dead:
                        return
                    raise RuntimeError(f"host {name}: {exc}") from exc
                finally:
                    await chan.aclose()
                if "error" in reply:
                    raise RuntimeError(f"host {name}: {reply['error']}")
                results.update({int(k): v for k, v in reply["results"].items()})

            async with trio.open_nursery() as hosts:
                for h in topo.hosts:
                    hosts.start_soon(host, h.name, h.address)
            nursery.cancel_scope.cancel()
        after = await self._stats(topo)
        return results, merge_stats(
            {name: stats_delta(s, before.get(name, {})) for name, s in after.items()}
        )

    async def _stats(self, topo: Topology) -> dict[str, dict[str, Any]]:
        """Every live node's counters."""
        return {
            node.name: await control(node.address, {"cmd": "stats"})
            for node in topo.nodes.values()
            if node.name not in self.dead
        }

    async def node_died(self, name: str, code: int) -> bool:
        self.dead.add(name)
        if name in self.died:
            self.died[name].set()
        if self.topo is None or self.topo.nodes[name].kind is not NodeKind.HOST:
            return False  # a switch: the fabric is broken, stop
        ranks = [p.rank for p in host_places(self.topo, name)]
        await self.server.store.set(
            f"{self.params['job_id']}/abort", f"host {name} (ranks {ranks}) died with code {code}"
        )
        return True


class ExactCollectiveJob:
    """Job ``name`` on a fabric of node processes on the exact clock: every host starts its
    ranks while the coordinator holds the clock at 0 (the rendezvous store is a node of the run,
    kept by the coordinator), then the run goes window by window until every rank is done and
    the fabric is quiet - the virtual run's job, result for result."""

    def __init__(
        self,
        name: str,
        params: dict[str, Any],
        coordinator: Coordinator,
        join_timeout: float = 60.0,
    ) -> None:
        self.name = name
        self.params = params
        self.coordinator = coordinator
        self.join_timeout = join_timeout  # wall seconds for every node process to join

    async def run(
        self, topo: Topology, tdf: float, epoch: float
    ) -> tuple[dict[int, Any], dict[str, Any]]:
        fabric = ExactFabric(topo, self.coordinator, self.join_timeout)
        await fabric.joined()
        # each process starts its hosts' ranks in the topology's order, the processes at once
        # (each its own engine, its clock held at 0), then waits for them
        hosts = [h.name for h in topo.hosts]
        start = {"cmd": "collective", "name": self.name, "params": self.params, "store": "exact"}
        await fabric.ask(hosts, start)
        fabric.release()
        done = {"cmd": "collective", "results": True}
        replies = await fabric.ask(hosts, done, timeout=math.inf)
        results: dict[int, Any] = {}
        for name in hosts:  # as the hosts come in the topology
            results.update({int(k): v for k, v in replies[name]["results"].items()})
        return results, await fabric.stats()

    async def node_died(self, name: str, code: int) -> bool:
        return False  # the coordinator stops the run, naming it


@dataclass(frozen=True, slots=True)
class JobRun:
    """What a collective job gives: each rank's result, the fabric's counters, and for an
    exact run how it was synchronised."""

    results: dict[int, Any]
    fabric: dict[str, Any]
    synced: str = ""


def run_job(
    topo: Topology,
    path: str,
    name: str,
    params: dict[str, Any],
    options: RunOptions,
    *,
    quiet: bool = True,
    beside: Callable[..., Awaitable[None]] | None = None,
) -> JobRun:
    """Job ``name`` on every rank of ``topo`` (read from ``path`` by node processes) on the
    options' clock: one event engine (virtual); one process per node, or ``workers``
    processes, synchronised on emulated time (exact: the virtual run's results); or one
    process per node on the dilated wall clock.  ``quiet=False`` lists the node processes
    first; ``beside``: a task alongside them (the live map).  A SyncError (one line) when an
    exact run could not go on."""
    if options.clock is Clock.VIRTUAL:
        return JobRun(*run_virtual(topo, name, params))

    def make_job(coordinator: Coordinator | None) -> FabricJob:
        if coordinator is None:
            return CollectiveJob(name, params)
        return ExactCollectiveJob(name, params, coordinator)

    (results, fabric), synced = run_on_processes(
        topo, path, options, make_job, quiet=quiet, beside=beside
    )
    return JobRun(results, fabric, synced)


ATTACHED_JOIN_TIMEOUT = 300.0  # wall seconds: containers starting on a busy machine


def own_address(towards: str) -> str:
    """This machine's address on the route to ``towards`` (a container's, on its network)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((towards, 9))
        return str(s.getsockname()[0])


def run_attached(
    topo: Topology,
    name: str,
    params: dict[str, Any],
    options: RunOptions,
    sync: tuple[str, int] | None = None,
) -> JobRun:
    """Job ``name`` on node processes started elsewhere (the compose testbed's containers), on
    the options' clock.  Wall: a fabric already running; the store listens on this machine's
    address on the route to the hosts (a loopback address for local fabrics, the container's
    for the testbed), never on every interface.  Exact: the nodes were started with
    ``rocev2-emu node ... --clock exact --sync HOST:PORT`` (grouped as the options' ``workers``
    group them, a swarm stack's worker services); the coordinator is served here on ``sync``,
    every node process joins it (proving the fabric's secret) within
    :data:`ATTACHED_JOIN_TIMEOUT`, and the job runs as :func:`run_job` runs it - the virtual
    run's results; once it is done the coordinator ends the run and the node processes exit.
    A SyncError (one line) when an exact run could not go on."""
    attach(topo)
    if options.clock is not Clock.EXACT:
        host = own_address(topo.hosts[0].address)
        job = CollectiveJob(name, params, store_host=host, bind_host=host)
        return JobRun(*trio.run(job.run, topo, topo.tdf, 0.0))
    if sync is None:
        raise ValueError("an attached exact job needs the address to serve its coordinator on")
    coordinator = coordinator_for(topo, fabric_secret(), pace=options.pace, workers=options.workers)
    exact = ExactCollectiveJob(name, params, coordinator, ATTACHED_JOIN_TIMEOUT)

    async def main() -> tuple[dict[int, Any], dict[str, Any]]:
        async with trio.open_nursery() as nursery:
            await nursery.start(partial(coordinator.serve, *sync))
            outcome = await exact.run(topo, 1.0, 0.0)
            nursery.cancel_scope.cancel()
        return outcome

    results, fabric = run_synced(main)
    return JobRun(results, fabric, coordinator.summary())


def run_topology_data(
    data: dict[str, Any],
    name: str,
    tdf: float,
    job: str,
    params: dict[str, Any],
    prepare: Callable[[Topology, str], None] | None = None,
    mode: Mode | None = None,
) -> tuple[dict[int, Any], dict[str, Any]]:
    """Job ``job`` with processes on a topology given as data (a scenario's): written to a
    temporary file for the nodes to read, removed afterwards; on the exact clock when the
    scenario's ``mode`` says so (``tdf`` then unused).  ``prepare(topo, path)`` runs
    first (to put the path in ``params``, say); a scenario's ``mode`` may put the live map
    beside the job (``scenario NAME --ui``)."""
    if mode is not None:
        data = with_payload_data(data, mode.run.payload)
    with tempfile.TemporaryDirectory(prefix=f"{name}-") as tmp:
        path = Path(tmp) / f"{name}.toml"
        path.write_text(to_toml(data))
        topo = parse(data, str(path))
        if prepare is not None:
            prepare(topo, str(path))
        ui = mode.ui(topo) if mode is not None and mode.ui is not None else None
        options = mode.run if mode is not None and mode.processes else RunOptions(Clock.WALL, tdf)
        run = run_job(topo, str(path), job, params, options, beside=ui)
        return run.results, run.fabric


def run_recorded(
    topo: Topology,
    job: str,
    params: dict[str, Any],
    label: str,
    mode: Mode | None = None,
    *,
    beside: Callable[[dict[str, Any], dict[str, Any]], Awaitable[None]] | None = None,
    flows: list[FlowSpec] | None = None,
) -> tuple[dict[int, Any], dict[str, Any]]:
    """A scenario's job in virtual time (:func:`~collectives.jobs.job.run_virtual`), recorded for
    the map's replay as ``label`` when its ``mode`` records: the fabric, and every rank's
    progress from the job's own metrics; timing-only if the mode's payload says so."""
    if mode is not None and mode.run.payload is not None:
        topo.payload = mode.run.payload
    if mode is None or mode.record is None:
        return run_virtual(topo, job, params, flows=flows, beside=beside)
    metrics = HostCollectiveMetrics(CollectorRegistry())
    watch = mode.record(topo, label, metrics.registry)
    return run_virtual(topo, job, params, metrics, flows=flows, beside=beside, watch=watch)
