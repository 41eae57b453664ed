"""One node of a fabric - a switch or a host - built from the topology file, on real UDP.

``rocev2-emu node TOPOLOGY NAME`` is what the supervisor (``rocev2-emu up``) starts once per
node in local mode, and what a container runs in compose mode.  Every node listens on its own
address (from the topology): VXLAN links on UDP 14789, Prometheus metrics on TCP 9100 and a
control port on TCP 18515 (a host's agent runs flows there, and the commands of the services
registered in :mod:`rocev2_emu.fabric.services`; a switch takes link up/down and route updates
and reports its counters, :mod:`switch.node`).  When it is ready it prints one line::

    READY <name> metrics=http://<addr>:9100/metrics control=<addr>:18515

(``metrics=off`` with ``--no-metrics``).

This module also turns the topology into what the cores and drivers take (:func:`host_config`,
:func:`switch_driver`), for the virtual fabric as much as for processes.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, Final

import trio
from prometheus_client import CollectorRegistry

from rocev2_emu.control.channel import stop_soon
from rocev2_emu.control.requests import Handler, NoFields, Table
from rocev2_emu.fabric.agent import CONTROL_PORT, HostAgent, host_map_state
from rocev2_emu.fabric.agent_server import AgentServer
from rocev2_emu.fabric.services import host_services
from rocev2_emu.nic.ingress import IngressConfig
from rocev2_emu.nic.metrics import nic_registry
from rocev2_emu.runtime.clock import DilatedClock
from rocev2_emu.runtime.link import LinkFaults
from rocev2_emu.runtime.metrics import serve
from rocev2_emu.runtime.ports import DatagramPort, batch_mode
from rocev2_emu.topology.model import Link, NodeKind, Topology, dcqcn_params, refuse_split_servers
from rocev2_emu.verbs.api import Context, DeviceConfig
from rocev2_emu.wire.ethernet import LINK_UDP_PORT
from switch.driver import SwitchDriver
from switch.node import run_switch
from switch.pipeline import SwitchCore

METRICS_PORT: Final = 9100


@dataclass(slots=True)
class NodeOptions:
    tdf: float
    epoch: float | None = None
    metrics: bool = True
    parent_pid: int = 0  # exit when this process is gone (0: never)
    metrics_addr: str | None = None  # where /metrics listens (default: the node's address)


def link_faults(topo: Topology, link: Link) -> LinkFaults:
    """A link's configured faults, seeded per link from the topology's seed."""
    return LinkFaults(loss=link.loss, delay=link.delay, seed=topo.link_seed(link))


def switch_ports(topo: Topology, name: str) -> tuple[list[tuple[str, int]], list[LinkFaults]]:
    """Each port's peer address and link faults, in port order."""
    node = topo.nodes[name]
    peers = [(topo.nodes[peer].address, LINK_UDP_PORT) for _, peer in node.ports]
    faults = [link_faults(topo, link) for link, _ in node.ports]
    return peers, faults


def switch_driver(
    topo: Topology, name: str, port: DatagramPort, clock: DilatedClock
) -> SwitchDriver:
    peers, faults = switch_ports(topo, name)
    return SwitchDriver(SwitchCore(topo.switch_config(name)), port, clock, peers, faults)


def host_config(
    topo: Topology, name: str, tdf: float, epoch: float | None, *, seeded: bool = False
) -> DeviceConfig:
    """A host's NIC as the topology says; ``seeded`` draws QPNs and PSNs from the topology's
    seed (virtual mode, where runs must repeat) instead of a CSPRNG."""
    node = topo.nodes[name]
    link, peer = topo.host_link(name)
    return DeviceConfig(
        bind=node.address,
        port=LINK_UDP_PORT,
        gid=node.ip,
        link_peer=(peer.address, LINK_UDP_PORT),
        link_gbps=link.rate_bps / 1e9,
        tdf=tdf,
        faults=link_faults(topo, link),
        next_hop_mac=topo.mac_of(peer.name, link),
        vni=link.vni,
        epoch=epoch,
        seed=topo.seed * 1000 + node.index if seeded else None,
        dcqcn=dcqcn_params(topo),
        max_inflight=topo.transport["max_inflight"],
        pacing_gbps=float(topo.transport["pacing_gbps"]),
        batch_io=topo.batch_io,
        timing_only=topo.timing_only,
        ingress=IngressConfig(
            rx_bps=node.rx_gbps * 1e9, priorities=frozenset(topo.pfc["lossless_priorities"])
        )
        if node.rx_gbps and topo.pfc["enabled"]
        else None,
    )


def host_agent(topo: Topology, ctx: Context, name: str) -> HostAgent:
    return HostAgent(
        ctx,
        name,
        mtu=topo.mtu,
        qp_timeout=topo.transport["qp_timeout"],
        retry_cnt=topo.transport["retry_cnt"],
    )


PROGRESS_SERIES = {
    "rocev2_collective_operations_total": "ops",
    "rocev2_collective_bytes_total": "bytes",
    "rocev2_collective_op_received_bytes": "op_received",
    "rocev2_collective_op_expected_bytes": "op_expected",
}


def rank_progress(
    registry: CollectorRegistry, ranks_here: set[int] | None = None
) -> dict[str, dict[str, float]]:
    """Per rank of the collectives this host runs: operations finished, bytes moved, and the
    operation in progress (bytes received so far, and expected), read from its registry's
    ``rocev2_collective_*`` series (registered by the collectives plugin or a PyTorch rank;
    none: no ranks).  ``ranks_here``: only these ranks (a registry shared by many hosts)."""
    ranks: dict[str, dict[str, float]] = {}
    # only these series: the whole registry (the latency histogram's buckets) is 15x the cost
    for family in registry.restricted_registry(list(PROGRESS_SERIES)).collect():
        for sample in family.samples:
            rank = sample.labels.get("rank")
            key = PROGRESS_SERIES.get(sample.name)
            if rank is None or key is None:
                continue
            if ranks_here is not None and int(rank) not in ranks_here:
                continue
            row = ranks.setdefault(rank, dict.fromkeys(PROGRESS_SERIES.values(), 0.0))
            row[key] += sample.value
    return ranks


def server_fabric_state(registry: CollectorRegistry) -> dict[str, dict[str, list[float]]]:
    """Per server whose fabric counts on ``registry`` (:mod:`rocev2_emu.server.fabric`'s
    ``rocev2_server_fabric_*`` series, labelled by server): each accelerator's bytes sent and
    emulated seconds busy sending and receiving (``tx_bytes``, ``tx_busy``, ``rx_busy``)."""
    keys = {
        "rocev2_server_fabric_tx_bytes_total": "tx_bytes",
        "rocev2_server_fabric_busy_seconds_total": "busy",
    }
    servers: dict[str, dict[str, list[float]]] = {}
    for family in registry.collect():
        for sample in family.samples:
            key = keys.get(sample.name)
            if key is None:
                continue
            if key == "busy":
                key = f"{sample.labels['direction']}_busy"
            row = servers.setdefault(sample.labels["node"], {})
            port = int(sample.labels["accelerator"])
            values = row.setdefault(key, [])
            values.extend([0.0] * (port + 1 - len(values)))
            values[port] = sample.value
    return servers


def map_handler(ctx: Context, registry: CollectorRegistry) -> Handler:
    """The host's ``map`` command: what the live map shows of it (:mod:`rocev2_emu.ui`): its
    NIC, its ranks' progress and its server's fabric (on the registry of the server's host)."""

    async def handle(_: NoFields) -> dict[str, Any]:
        return {
            **host_map_state(ctx),
            "ranks": rank_progress(registry),
            "server_fabric": server_fabric_state(registry),
        }

    return handle


async def _orphan_guard(parent: int) -> None:
    """A node started by a supervisor dies with it, instead of holding its addresses forever."""
    while os.getppid() == parent:  # noqa: ASYNC110 - no event tells of a parent's death
        await trio.sleep(0.5)
    raise SystemExit(f"the launcher (pid {parent}) is gone")


async def run_node(topo: Topology, name: str, opts: NodeOptions) -> None:
    async with trio.open_nursery() as nursery:
        if opts.parent_pid:
            nursery.start_soon(_orphan_guard, opts.parent_pid)
        await _run_node(topo, name, opts)
        nursery.cancel_scope.cancel()


def metrics_url(address: str, served: bool) -> str:
    """Where a READY line says the node's /metrics is: its URL, or ``off`` (``--no-metrics``)."""
    return f"http://{address}:{METRICS_PORT}/metrics" if served else "off"


async def _run_node(topo: Topology, name: str, opts: NodeOptions) -> None:
    node = topo.nodes.get(name)
    if node is None:
        raise ValueError(f"{topo.path}: no node named {name!r}")
    refuse_split_servers(topo, [name])
    ready = (
        f"READY {name} metrics={metrics_url(node.address, opts.metrics)} "
        f"control={node.address}:{CONTROL_PORT} batch_io={{batch_io}}"
    )
    metrics_at = (opts.metrics_addr or node.address, METRICS_PORT) if opts.metrics else None
    if node.kind is NodeKind.SWITCH:
        peers, faults = switch_ports(topo, name)
        await run_switch(
            topo.switch_config(name),
            node.address,
            LINK_UDP_PORT,
            peers,
            faults,
            DilatedClock(opts.tdf, epoch=opts.epoch),
            control_port=CONTROL_PORT,
            metrics=metrics_at,
            batch_io=topo.batch_io,
            ready=f"{ready} ecmp={topo.ecmp}",
        )
        return
    async with host_node(topo, name, opts, {"stop": (NoFields, stop_soon)}) as (ctx, _):
        print(ready.format(batch_io=batch_mode(ctx.port)), flush=True)
        await trio.sleep_forever()


@asynccontextmanager
async def host_node(
    topo: Topology,
    name: str,
    opts: NodeOptions,
    extra: Table | None = None,
) -> AsyncIterator[tuple[Context, CollectorRegistry]]:
    """Host ``name`` of the fabric in this process, for as long as the block runs: its NIC on
    the host's address, its ``/metrics`` (``opts.metrics``) and its agent on the control port
    (the registered host services, and ``extra`` commands).  The node process runs it, and so
    does a PyTorch rank (:mod:`collectives.pytorch`), whose process is its host."""
    async with Context.open(host_config(topo, name, opts.tdf, opts.epoch)) as ctx:
        registry = nic_registry(ctx.driver, name)
        handlers = host_services(topo, ctx, name, registry)
        handlers["map"] = (NoFields, map_handler(ctx, registry))
        handlers.update(extra or {})
        if opts.metrics:
            serve(registry, METRICS_PORT, addr=opts.metrics_addr or topo.nodes[name].address)
        agent = host_agent(topo, ctx, name)
        address = topo.nodes[name].address
        async with trio.open_nursery() as nursery:
            await nursery.start(AgentServer(agent, handlers).serve, address, CONTROL_PORT)
            yield ctx, registry
            nursery.cancel_scope.cancel()
