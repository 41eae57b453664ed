"""The node side of the exact process mode: a process hosting one node or a group of them
(``rocev2-emu node TOPOLOGY NAME --clock exact --sync HOST:PORT``) joins the run's coordinator,
builds its cores with the virtual fabric's builder (:mod:`rocev2_emu.fabric.engine_nodes`) - the
same seeded QPNs and PSNs, the same link faults - serves its control ports as a process-mode
node does, and runs its :class:`~rocev2_emu.runtime.exact.ExactEngine` window by window.
The supervisor's side is :mod:`rocev2_emu.fabric.exact`.

A change from outside the run (``rocev2-emu link``, the map's clicks) is the
``change_links`` control request to any node: the node asks for it without an instant, the
coordinator gives it the first instant no process has passed, and the reply names that
instant.  The per-port commands (``set_link``, ``set_faults``, ``set_routes``) are refused:
one switch alone would change at no instant the others share (the requests:
:mod:`rocev2_emu.fabric.exact_requests`).
"""

from __future__ import annotations

import contextlib
import math
import os
import resource
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from functools import partial
from typing import Any, Final

import trio
import trio.testing
from prometheus_client import CollectorRegistry

from rocev2_emu.control import auth
from rocev2_emu.control.channel import ControlError, MessageChannel, prove_secret, stop_soon
from rocev2_emu.control.requests import NoFields, Table
from rocev2_emu.fabric.agent import CONTROL_PORT, HostAgent
from rocev2_emu.fabric.agent_server import AgentServer, OpenFlows, open_flows_on
from rocev2_emu.fabric.changes import changed_faults, set_faults_on, switch_changes
from rocev2_emu.fabric.engine_nodes import build_nodes
from rocev2_emu.fabric.exact_requests import (
    ChangeLinks,
    ForNodes,
    NodeStats,
    change_links_handler,
    refusals,
)
from rocev2_emu.fabric.layout import PROCESS_COMMANDS, at_addresses
from rocev2_emu.fabric.nodes import (
    METRICS_PORT,
    map_handler,
    metrics_url,
)
from rocev2_emu.fabric.services import host_services
from rocev2_emu.nic.driver import EngineNic
from rocev2_emu.nic.metrics import nic_registry
from rocev2_emu.runtime.collector import engine_collector
from rocev2_emu.runtime.determinism import canonical_trio_scheduler
from rocev2_emu.runtime.events import Node
from rocev2_emu.runtime.exact import ExactEngine
from rocev2_emu.runtime.exchange import RemoteLink
from rocev2_emu.runtime.link import LinkFaults
from rocev2_emu.runtime.metrics import merged, serve_nodes
from rocev2_emu.runtime.ports import UdpPort
from rocev2_emu.runtime.sync import SyncAddress, sync_label
from rocev2_emu.runtime.sync_messages import (
    Hello,
    LinkChange,
    ended_normally,
)
from rocev2_emu.runtime.wall_server import Reply, WallServer
from rocev2_emu.topology.model import Link, NodeKind, Topology
from rocev2_emu.topology.processes import process_groups, process_name
from rocev2_emu.verbs.api import Context
from rocev2_emu.wire.ethernet import LINK_UDP_PORT
from switch.driver import EngineSwitch
from switch.metrics import SwitchCollector
from switch.node import control_replies, control_table
from switch.pipeline import SwitchCore


def run_node_group(
    topo: Topology,
    names: list[str],
    sync: SyncAddress,
    *,
    metrics: bool = True,
    workers: int | None = None,
    metrics_addr: str | None = None,
    join_timeout: float = 0.0,
) -> None:
    """``rocev2-emu node TOPOLOGY NAME[,NAME...] --clock exact``: these nodes (one process of
    :func:`process_groups` with ``workers``) until the coordinator ends the run (``metrics``:
    serving /metrics, in emulated time; ``metrics_addr``: there rather than at the node's
    address, for a process of one node - a container's 0.0.0.0).  ``join_timeout``: wall
    seconds to wait for the coordinator to listen (a container started before the job that
    serves it); 0: it must listen already."""
    unknown = [n for n in names if n not in topo.nodes]
    if unknown:
        raise ValueError(f"{topo.path}: no node named {unknown[0]!r}")
    groups = process_groups(topo, workers)
    if sorted(names) not in (sorted(g) for g in groups):
        hint = f"one of {[process_name(g) for g in groups]}"
        if workers is None:  # one node, or the hosts of one server
            hint = process_name(next(g for g in groups if names[0] in g))
        raise ValueError(f"{process_name(names)}: a process of this run hosts {hint}")
    if metrics_addr is not None and len(names) > 1:
        raise ValueError("--metrics-addr: a process of several nodes serves each at its address")
    enough_files(len(names), metrics)
    where = JoinOptions(metrics_addr, join_timeout)
    run_process(partial(_node_process, topo, groups, names, sync, metrics, where))


def run_process(main: Callable[[], Awaitable[None]]) -> None:
    """``main`` as (the trio run of) one process of an exact run: trio under MockClock with
    the canonical scheduler, until the coordinator ends the run (its RunOver is the normal end;
    anything else is raised)."""
    canonical_trio_scheduler()
    batch_scheduling()
    try:
        with engine_collector():
            trio.run(main, clock=trio.testing.MockClock())
    except BaseException as exc:
        if not ended_normally(exc):
            raise


def batch_scheduling() -> None:
    """This process (and the threads it starts from now on) under Linux's ``SCHED_BATCH``: a
    node process the coordinator wakes with a grant no longer preempts the coordinator on
    its CPU.  Under the default policy a woken node took the CPU from the coordinator between
    two grants of one window, and the other node waited for its grant until the scheduler gave
    the coordinator a CPU again: 1-4 ms in 81-99 of 846 windows of ``bench virtual b --workers
    2``, 0.27-0.36 s of the run; under SCHED_BATCH 0-1 windows.  It changes only when a process
    gets a CPU, never what it computes (the exact run's results are the same).  Any process may
    take it (priority 0, no privilege); where the call is missing or refused (another OS, a
    sandbox) the process keeps its policy."""
    with contextlib.suppress(AttributeError, OSError):
        os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))


# what the kernel may hold of the frames other processes sent this one (forced where the
# process may: CAP_NET_ADMIN; else net.core.rmem_max)
EXCHANGE_BUFFER: Final = 256 << 20
FILES_PER_NODE: Final = 3  # its control listener and /metrics listener, a control connection
FILES_BESIDE: Final = 64  # the link socket, the coordinator, trio's own, imports, a scrape


def enough_files(nodes: int, metrics: bool) -> None:
    """A process hosting many nodes (``--workers``) holds a few sockets per node: raise the
    soft limit on open files when it is short (as servers do), and the hard one too where the
    process may (root, or CAP_SYS_RESOURCE: up to the kernel's ``fs.nr_open``), or say in one
    line why the process cannot start."""
    need = nodes * (FILES_PER_NODE if metrics else FILES_PER_NODE - 1) + FILES_BESIDE
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= need:
        return
    if hard == resource.RLIM_INFINITY or hard >= need:
        resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))
        return
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (need, need))
    except (OSError, ValueError):
        raise ValueError(
            f"this process would host {nodes} nodes and needs about {need} open files; the "
            f"limit is {hard} (ulimit -Hn): raise it, or give --workers more processes"
        ) from None


@dataclass(frozen=True, slots=True)
class JoinOptions:
    """How a node process started from outside (a container) joins its run."""

    metrics_addr: str | None = None  # where its one node serves /metrics (None: its address)
    join_timeout: float = 0.0  # wall seconds to wait for the coordinator to listen


async def _node_process(
    topo: Topology,
    groups: list[list[str]],
    names: list[str],
    sync: SyncAddress,
    metrics: bool,
    join: JoinOptions,
) -> None:
    """One node process of an exact run (:func:`joined_nodes`), until the run ends."""
    async with joined_nodes(topo, groups, names, sync, metrics, join) as process:
        for node in process.nodes:
            print(
                f"READY {node.name} metrics={metrics_url(node.address, metrics)} "
                f"control={node.address}:{CONTROL_PORT} clock=exact",
                flush=True,
            )
        await trio.sleep_forever()


@dataclass(slots=True)
class JoinedProcess:
    """What :func:`joined_nodes` runs: the engine, its nodes, their hosts' contexts and
    registries by name."""

    engine: ExactEngine
    nodes: list[Any]
    contexts: dict[str, Context]
    registries: dict[str, CollectorRegistry]


@asynccontextmanager
async def joined_nodes(
    topo: Topology,
    groups: list[list[str]],
    names: list[str],
    sync: SyncAddress,
    metrics: bool,
    join: JoinOptions = JoinOptions(),
) -> AsyncIterator[JoinedProcess]:
    """The nodes ``names`` of an exact run on one engine of this process, wired to each other
    on its heap and to the other processes' nodes by UDP, from the socket of its first node's
    address (where the others send), their control ports (and ``metrics``: /metrics) served;
    the engine runs window by window while the body does (a node process waits; a torch rank
    runs its training), and a RunOver ends both when the coordinator ends the run."""
    # each process's name once, shared by its nodes' entries (a name is every node of its
    # process: 65 KB for a quarter of the 24 576-accelerator cluster, 1.7 GB made per node)
    named = [(process_name(g), g) for g in groups]
    home = {n: name for name, g in named for n in g}
    socket_of = {name: topo.nodes[g[0]].address for name, g in named}
    me = home[names[0]]
    mine = [topo.nodes[n] for n in topo.nodes if n in names]  # the topology's order
    secret = auth.current()
    chan = await join_coordinator(sync, secret, join.join_timeout)
    chan.timeout = math.inf  # the coordinator says when; it watches the wall clock
    hosts = [n.index for n in mine if n.kind is NodeKind.HOST]
    await chan.send(Hello(me, tuple(hosts)).wire())
    # a window's frames from the other processes arrive in bursts, each sent when its
    # process reports, while this one may still compute or wait for its grant: the kernel
    # holds them (a datagram that does not fit is lost, and the run stops)
    udp = UdpPort((socket_of[me], LINK_UDP_PORT), None, batch=False, receive_buffer=EXCHANGE_BUFFER)
    engine = ExactEngine(me, udp, chan)
    engine.install()  # before the control ports listen: a job's first request may come at once

    async def engine_state(_: NoFields) -> dict[str, Any]:
        """The engine's state, for the run's summary and for a run that is stuck."""
        stats = trio.lowlevel.current_statistics()
        return {
            "process": me,
            "frame_hops": engine.hops,
            "rounds": engine.rounds,
            "now": engine.now,
            "received": engine.exchange.received,
            "sent": dict(engine.exchange.sent),
            "holds": engine.holds,
            "heap_next": engine.events.next_event_time(),
            "tasks": stats.tasks_living,
            "next_deadline": stats.seconds_to_next_deadline,
        }

    handlers: dict[str, Reply] = {}  # each node's control requests, by name

    def asked(names: list[str]) -> list[Reply]:
        for name in names:
            if name not in handlers:
                raise ValueError(f"{name!r:.40} is not a node of this process")
        return [handlers[name] for name in names]

    async def node_stats(req: NodeStats) -> dict[str, Any]:
        replies = asked(req.names)
        return {
            "nodes": {
                name: await reply({"cmd": "stats"})
                for name, reply in zip(req.names, replies, strict=True)
            }
        }

    async def for_nodes(req: ForNodes) -> dict[str, Any]:
        return {"replies": [await reply(req.request) for reply in asked(req.names)]}

    agents: dict[str, HostAgent] = {}  # this process's hosts' (filled below)
    more: Table = {
        "engine": (NoFields, engine_state),
        "node_stats": (NodeStats, node_stats),
        "change_links": (ChangeLinks, change_links_handler(topo, engine)),
        "stop": (NoFields, stop_soon),  # the whole process, with every node it hosts
        "open_flows": (OpenFlows, partial(open_flows_on, agents)),
        "for_nodes": (ForNodes, for_nodes),
    }
    assert set(more) == PROCESS_COMMANDS
    changes: list[Callable[[LinkChange, float], None]] = []  # one per switch here

    def on_change(change: LinkChange, now: float) -> None:
        if change.faults is not None:  # the links' faults, at the ends this process holds
            changed = changed_faults(topo, change.pairs, dict(change.faults), exact=True)
            set_faults_on(topo, locals_, changed)
            return
        for apply in changes:
            apply(change, now)

    engine.changes.on_change = on_change
    registries: dict[str, CollectorRegistry] = {}  # each node's metrics, by name
    contexts: dict[str, Context] = {}

    def on_switch(name: str, switch: EngineSwitch) -> None:
        changes.append(link_changes(topo, name, switch.core))
        reply = control_replies(switch, {**more, **refusals(control_table(switch))})
        registry = CollectorRegistry()
        registry.register(SwitchCollector(switch))
        switch.clock.threadsafe = lambda: engine.events.now  # for /metrics' thread
        handlers[name], registries[name] = reply, registry

    async def on_host(name: str, agent: HostAgent) -> None:
        ctx = agent.ctx
        assert isinstance(ctx.driver, EngineNic)
        contexts[name] = ctx
        registry = nic_registry(ctx.driver, name)
        services = host_services(topo, ctx, name, registry)
        services["map"] = (NoFields, map_handler(ctx, registry))  # the live map's
        agents[name] = agent
        refused = refusals(AgentServer(agent).table)
        agent_server = AgentServer(agent, {**services, **more, **refused}, secret)
        await nursery.start(agent_server.keep_jobs)
        ctx.clock.threadsafe = lambda: engine.events.now
        handlers[name], registries[name] = agent_server.dispatch, registry

    def remote(link: Link, node: Node, port: int, peer: str, faults: LinkFaults | None) -> None:
        far = (socket_of[home[peer]], LINK_UDP_PORT)
        engine.link(RemoteLink(node, port, link.vni, home[peer], far, faults))

    async with trio.open_nursery() as nursery, AsyncExitStack() as stack:
        built = await build_nodes(
            topo, set(names), engine, stack, remote=remote, on_switch=on_switch, on_host=on_host
        )
        locals_ = built.nodes
        # each address's nodes: one, or several sharing their process's port (a swarm stack's
        # worker; they answer by name through for_nodes, a command every node's table has)
        at = at_addresses(topo, [n.name for n in mine]).items()
        if metrics:
            served = {a: merged([registries[n] for n in names]) for a, names in at}
            if join.metrics_addr is not None:  # one node (run_node checked)
                served = {join.metrics_addr: next(iter(registries.values()))}
            serve_nodes(served, METRICS_PORT)
        ports = {(a, CONTROL_PORT): handlers[names[0]] for a, names in at}
        await WallServer(ports, secret, engine.interrupt).start()
        await nursery.start(engine.run)
        yield JoinedProcess(engine, mine, contexts, registries)
        nursery.cancel_scope.cancel()


async def join_coordinator(sync: SyncAddress, secret: bytes, timeout: float) -> MessageChannel:
    """The channel to the run's coordinator at ``sync``, proving the fabric's secret: at once,
    or trying again for up to ``timeout`` wall seconds while nothing listens there yet (a
    container's job not started yet).  This process's trio clock is the engine's, which stands
    still before the run, so the connection and the waits are a thread's, on the wall clock."""
    deadline = time.monotonic() + timeout
    where = sync_label(sync)
    while True:
        try:
            sock = await trio.to_thread.run_sync(partial(_connect, sync))
            break
        except OSError as exc:
            if time.monotonic() >= deadline:
                waited = f" within {timeout:g} s" if timeout else ""
                raise ControlError(
                    f"no coordinator at {where}{waited} ({exc.strerror or exc}): "
                    "the process serving the run (rocev2-emu up, bench, the testbed's job) "
                    "must be running"
                ) from exc
        await trio.to_thread.run_sync(time.sleep, 0.25)
    chan = MessageChannel(trio.SocketStream(trio.socket.from_stdlib_socket(sock)), 30.0)
    await prove_secret(chan, secret, where)
    return chan


def _connect(sync: SyncAddress) -> socket.socket:
    """A connection to the coordinator: TCP to ``(host, port)``, or its Unix socket."""
    if not isinstance(sync, str):
        return socket.create_connection(sync, 5.0)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(5.0)
        sock.connect(sync)
    except OSError:
        sock.close()
        raise
    return sock


def link_changes(
    topo: Topology, name: str, core: SwitchCore
) -> Callable[[LinkChange, float], None]:
    """What a change handed out in the run does to switch ``name``
    (:func:`~rocev2_emu.fabric.changes.switch_changes`)."""
    apply = switch_changes(topo, name, core)
    return lambda change, now: apply(change.pairs, change.up, now)
