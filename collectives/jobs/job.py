"""Running a job's ranks: placement from the topology (:mod:`collectives.jobs.places`), and the two
ways to run them.

Ranks are numbered host-major in the order the topology lists its hosts (as torchrun numbers
node rank x local size + local rank); each host runs its ``ranks`` as tasks of its own process,
sharing its NIC.  The ranks of one server - a host's, or those of the hosts naming one
``server``, a NIC per accelerator, which share a process - share a
:class:`~collectives.comm.communicator.HostGroup` and the server's fabric.

* :func:`run_virtual` - every switch, host and rank in this process, in virtual time, with an
  in-memory store.
* :func:`run_host_ranks` - what a host process does when the launcher asks it to run a job
  (:mod:`rocev2_emu.fabric.agent`'s ``collective`` command): connect to the launcher's
  :class:`~collectives.comm.store.StoreServer`, run its ranks, return their results.

A job is a coroutine registered by name in :data:`collectives.jobs.registry.JOBS`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Iterator
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from typing import Any

import trio
from prometheus_client import CollectorRegistry

from collectives.comm.communicator import (
    CollectiveError,
    CommOptions,
    Communicator,
    HostGroup,
    RankPlace,
)
from collectives.comm.metrics import HostCollectiveMetrics
from collectives.comm.ring import first_error
from collectives.comm.store import Store, TcpStore, VirtualStore, exact_store
from collectives.jobs.places import comm_options, host_places, places_for, server_ranks
from collectives.jobs.registry import JOBS, job_named
from rocev2_emu.fabric.agent import FlowSpec
from rocev2_emu.fabric.flows import run_flows
from rocev2_emu.fabric.report import fabric_stats
from rocev2_emu.fabric.virtual import (
    Watcher,
    fabric_quiet,
    run_virtual_time,
    virtual_fabric,
    watching,
)
from rocev2_emu.server.fabric import ServerFabric, host_server_fabric, open_server_fabric
from rocev2_emu.topology.model import Topology
from rocev2_emu.verbs import Context, RemoteVerbsError


async def run_rank(
    ctx: Context,
    store: Store,
    abort_store: Store | None,
    places: list[RankPlace],
    rank: int,
    group: HostGroup,
    name: str,
    params: dict[str, Any],
    options: CommOptions,
    metrics: HostCollectiveMetrics | None,
    results: dict[int, Any],
) -> None:
    """One rank: connect, run job ``name``, tear down; its result (or ``{"error": ...}``,
    so the job's other ranks may still report) goes in ``results[rank]``."""
    try:
        async with trio.open_nursery() as nursery:
            comm = await Communicator.create(
                ctx,
                store,
                places,
                rank,
                group,
                nursery,
                options,
                metrics=metrics.rank(rank) if metrics else None,
                abort_store=abort_store,
            )
            try:
                results[rank] = await job_named(name)(comm, params)
                # as NCCL's communicator teardown: nobody destroys its QPs while a peer still waits
                # for the acknowledgements of its last writes (an aborted job skips it)
                with contextlib.suppress(CollectiveError):
                    await comm.barrier()
            finally:
                comm.close()
                nursery.cancel_scope.cancel()
    except Exception as exc:  # reported per rank: the job's other ranks may still succeed
        error = first_error(exc) if isinstance(exc, BaseExceptionGroup) else exc
        results[rank] = {"error": f"{type(error).__name__}: {error}"}


async def run_host_ranks(
    ctx: Context,
    topo: Topology,
    host: str,
    store_address: tuple[str, int] | None,
    name: str,
    params: dict[str, Any],
    metrics: HostCollectiveMetrics | None = None,
    fabric: ServerFabric | None = None,
    group: HostGroup | None = None,
) -> dict[int, Any]:
    """This host's ranks of job ``name``; ``store_address``: the launcher's store server, or
    None in an exact run (the coordinator keeps the store); ``fabric``: the host's server
    fabric (None: one of the job's own); ``group``: the job's ranks of the server, shared with
    the server's other hosts (None: this host's ranks are the server's)."""
    places = places_for(topo)
    mine = host_places(topo, host)
    options = comm_options(topo, params)
    results: dict[int, Any] = {}
    stores: list[tuple[Store, Store | None]] = []
    if store_address is None:
        emulated = exact_store(topo.nodes[host].index, ctx.clock)
        stores = [(emulated, None) for _ in mine]
    else:
        try:  # every connection first: an unreachable store is one error naming it
            for _ in mine:
                stores.append(
                    (
                        await TcpStore.connect(*store_address, wait_for_listener=False),
                        await TcpStore.connect(*store_address, wait_for_listener=False),
                    )
                )
        except RemoteVerbsError as exc:
            where = f"{store_address[0]}:{store_address[1]}"
            raise RemoteVerbsError(f"the rendezvous store at {where}: {exc}") from exc
    registry = metrics.registry if metrics is not None else None
    async with AsyncExitStack() as stack, trio.open_nursery() as nursery:
        if group is None:
            if fabric is None:
                fabric = await stack.enter_async_context(
                    open_server_fabric(
                        topo.server,
                        len(mine),
                        ctx.clock,
                        engine=ctx.engine,
                        registry=registry,
                        node=host,
                    )
                )
            group = HostGroup(len(mine), fabric)
        for p, (store, abort_store) in zip(mine, stores, strict=True):
            nursery.start_soon(
                run_rank,
                ctx,
                store,
                abort_store,
                places,
                p.rank,
                group,
                name,
                params,
                options,
                metrics,
                results,
            )
    return results


@dataclass(frozen=True, slots=True)
class CollectiveRequest:
    """The host agent's ``collective`` command: run this host's ranks of job ``name`` with
    ``params``, meeting at the rendezvous store ``store`` (``[address, port]``), or, with
    ``store: "exact"``, start them in the background of an exact run; ``results: true`` waits
    for those."""

    name: str = ""
    params: dict[str, Any] = field(default_factory=dict)
    store: Any = None
    results: bool = False

    def __post_init__(self) -> None:
        if self.results:
            return
        if self.name not in JOBS:
            raise ValueError(f"unknown collective job {self.name!r}; known: {sorted(JOBS)}")
        store = self.store
        exact = store == "exact"
        where = (
            isinstance(store, list | tuple)
            and len(store) == 2
            and isinstance(store[0], str)
            and isinstance(store[1], int)
            and not isinstance(store[1], bool)
        )
        if not (exact or where):
            raise ValueError(f'store: {store!r:.60} is not [address, port] or "exact"')


@dataclass(slots=True)
class _ServerRoom:
    """A server's state in this process, shared by its hosts' ``collective`` commands (a NIC
    per accelerator puts a server's hosts in one process): its fabric, with its metrics on its
    first host's registry (``node`` = the server), and each running job's group of its ranks."""

    topo: Topology  # held, so that the key's id() stays this topology's
    fabric: ServerFabric
    ranks: int
    jobs: dict[str, tuple[HostGroup, int]] = field(default_factory=dict)

    @contextlib.contextmanager
    def group(self, job: str) -> Iterator[HostGroup]:
        """The group of job ``job``'s ranks of this server, for as long as one of its hosts
        here runs them."""
        group, users = self.jobs.get(job, (HostGroup(self.ranks, self.fabric), 0))
        self.jobs[job] = (group, users + 1)
        try:
            yield group
        finally:
            group, users = self.jobs[job]
            if users == 1:
                del self.jobs[job]
            else:
                self.jobs[job] = (group, users - 1)


_ROOMS: dict[tuple[int, str], _ServerRoom] = {}  # (id(topology), server): this process's servers


def collective_handler(
    topo: Topology, ctx: Context, host: str, registry: CollectorRegistry
) -> Callable[[CollectiveRequest], Awaitable[dict[str, Any]]]:
    """The host agent's ``collective`` command (a host service, registered by
    :mod:`collectives.plugin`): run this host's ranks of a job.  Its metric families are
    registered on the host's ``registry`` at once, so they are scraped as zeros before a job.

    In an exact run (``"store": "exact"``) the request only starts the ranks, in the background,
    while the coordinator holds the clock, and ``{"cmd": "collective", "results": true}`` waits
    for them: the ranks start at the same emulated instant however the requests travel."""
    metrics = HostCollectiveMetrics(registry)
    server = topo.server_of(host)
    shared = len(topo.server_hosts(host)) > 1  # a NIC per accelerator: hosts share a server

    def room() -> _ServerRoom:  # the server's, made with its first job on any of its hosts
        key = (id(topo), server)
        if key not in _ROOMS:
            ranks = server_ranks(topo, host)
            fab = host_server_fabric(
                topo.server, ranks, ctx.clock, engine=ctx.engine, registry=registry, node=server
            )
            _ROOMS[key] = _ServerRoom(topo, fab, ranks)
        return _ROOMS[key]

    started: list[str] = []  # the exact job started here (one per node process)
    finished: list[dict[int, Any]] = []
    done = trio.Event()

    async def run(where: tuple[str, int] | None, name: str, params: dict[str, Any]) -> Any:
        here = room()
        if not shared:
            return await run_host_ranks(ctx, topo, host, where, name, params, metrics, here.fabric)
        key = f"{params.get('job_id', 'job')}/{name}"
        with here.group(key) as group:
            return await run_host_ranks(
                ctx, topo, host, where, name, params, metrics, here.fabric, group
            )

    async def in_background(name: str, params: dict[str, Any]) -> None:
        results: dict[int, Any] = {}
        try:
            results = await run(None, name, params)
        except Exception as exc:  # handed to the results request, never out of the node
            results = {-1: {"error": f"{type(exc).__name__}: {exc}"}}
        finally:
            finished.append(results)
            done.set()

    async def handle(req: CollectiveRequest) -> dict[str, Any]:
        if req.results:
            if not started:
                raise ValueError("no exact collective job was started on this host")
            await done.wait()
            return {"results": {str(k): v for k, v in finished[-1].items()}}
        if req.store == "exact":
            if started:
                raise ValueError("an exact job already ran on this host")
            started.append(req.name)
            trio.lowlevel.spawn_system_task(in_background, req.name, dict(req.params))
            return {"started": True}
        where = (str(req.store[0]), int(req.store[1]))
        results = await run(where, req.name, dict(req.params))
        return {"results": {str(k): v for k, v in results.items()}}

    return handle


def run_virtual(
    topo: Topology,
    name: str,
    params: dict[str, Any],
    metrics: HostCollectiveMetrics | None = None,
    flows: list[FlowSpec] | None = None,
    beside: Callable[[dict[str, Any], dict[str, Any]], Awaitable[None]] | None = None,
    watch: Watcher | None = None,
) -> tuple[dict[int, Any], dict[str, Any]]:
    """Run job ``name`` on every rank of ``topo`` in virtual time; (results by rank, fabric).
    ``metrics``: one set of metric families for every rank (they differ by ``rank``);
    ``flows``: background traffic between hosts alongside (the straggler scenario's);
    ``beside(switches, agents)``: a task alongside the ranks (a fault at a chosen time);
    ``watch``: an observer of the run until the job ends (the map's recorder)."""

    async def main() -> tuple[dict[int, Any], dict[str, Any]]:
        places = places_for(topo)
        options = comm_options(topo, params)
        results: dict[int, Any] = {}
        async with virtual_fabric(topo) as (drivers, agents), AsyncExitStack() as servers:
            groups = {}
            for server, hosts in topo.servers.items():  # each on its first host's clock
                ctx = agents[hosts[0]].ctx
                ranks = server_ranks(topo, hosts[0])
                registry = metrics.registry if metrics is not None else None
                fab = await servers.enter_async_context(  # counted where the job's ranks are
                    open_server_fabric(
                        topo.server,
                        ranks,
                        ctx.clock,
                        engine=ctx.engine,
                        registry=registry,
                        node=server,
                    )
                )
                groups[server] = HostGroup(ranks, fab)
            service = await servers.enter_async_context(trio.open_nursery())
            first = next(iter(agents.values())).ctx
            store = VirtualStore(first.clock, first.engine)
            if not store.on_engine:
                service.start_soon(store.run)
            clients = {h.name: store.client(h.index, agents[h.name].ctx.clock) for h in topo.hosts}
            t0 = next(iter(agents.values())).ctx.now()
            with watching(watch, drivers, agents):
                async with trio.open_nursery() as nursery:
                    if flows:
                        nursery.start_soon(run_flows, agents, flows, t0)
                    if beside is not None:
                        nursery.start_soon(beside, drivers, agents)
                    for p in places:
                        nursery.start_soon(
                            run_rank,
                            agents[p.host].ctx,
                            clients[p.host],
                            None,
                            places,
                            p.rank,
                            groups[p.server],
                            name,
                            params,
                            options,
                            metrics,
                            results,
                        )
                await fabric_quiet(agents)  # the counters once nothing can change them
            service.cancel_scope.cancel()
            return results, fabric_stats(drivers, agents)

    return run_virtual_time(topo.seed, main)
