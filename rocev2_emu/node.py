"""One node of a fabric - a switch or a host - built from the topology file, on real UDP.

``rocev2-emu node TOPOLOGY NAME`` is what the launcher (``rocev2-emu up``) starts once per node
in local mode, and what a container runs in compose mode.  Every node listens on its own
address (from the topology): VXLAN links on UDP 4789, Prometheus metrics on TCP 9100 and a
control port on TCP 18515 (a host's agent runs flows there; a switch takes link up/down and
route updates and reports its counters).  When it is ready it prints one line::

    READY <name> metrics=http://<addr>:9100/metrics control=<addr>:18515
"""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass
from functools import partial
from typing import Any, Final

import trio
from prometheus_client import CollectorRegistry

from rocev2_emu.agent import CONTROL_PORT, AgentServer, HostAgent
from rocev2_emu.clock import DilatedClock
from rocev2_emu.ethernet import VXLAN_UDP_PORT
from rocev2_emu.ingress import IngressConfig
from rocev2_emu.link import LinkFaults
from rocev2_emu.metrics import nic_registry, serve
from rocev2_emu.oob import serve_requests
from rocev2_emu.ports import DatagramPort, UdpPort
from rocev2_emu.topology import Link, Topology, dcqcn_params
from rocev2_emu.verbs import Context, DeviceConfig
from switch.driver import SwitchDriver
from switch.metrics import SwitchCollector
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
    return LinkFaults(loss=link.loss, delay=link.delay, seed=topo.seed * 1000 + link.index)


def switch_driver(
    topo: Topology, name: str, port: DatagramPort, clock: DilatedClock
) -> SwitchDriver:
    node = topo.nodes[name]
    peers = [(topo.nodes[peer].address, VXLAN_UDP_PORT) for _, peer in node.ports]
    faults = [link_faults(topo, link) for link, _ in node.ports]
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
        port=VXLAN_UDP_PORT,
        gid=node.ip,
        link_peer=(peer.address, VXLAN_UDP_PORT),
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


async def _orphan_guard(parent: int) -> None:
    """A node started by a launcher dies with it, instead of holding its addresses forever."""
    while os.getppid() == parent:  # noqa: ASYNC110 - no event tells of a parent's death
        await trio.sleep(0.5)
    raise SystemExit(f"the launcher (pid {parent}) is gone")


async def run_node(topo: Topology, name: str, opts: NodeOptions) -> None:
    async with trio.open_nursery() as nursery:
        if opts.parent_pid:
            nursery.start_soon(_orphan_guard, opts.parent_pid)
        await _run_node(topo, name, opts)
        nursery.cancel_scope.cancel()


async def _run_node(topo: Topology, name: str, opts: NodeOptions) -> None:
    node = topo.nodes.get(name)
    if node is None:
        raise ValueError(f"{topo.path}: no node named {name!r}")
    ready = (
        f"READY {name} metrics=http://{node.address}:{METRICS_PORT}/metrics "
        f"control={node.address}:{CONTROL_PORT}"
    )
    if node.kind == "switch":
        clock = DilatedClock(opts.tdf, epoch=opts.epoch)
        udp = UdpPort((node.address, VXLAN_UDP_PORT))
        driver = switch_driver(topo, name, udp, clock)
        if opts.metrics:
            registry = CollectorRegistry()
            registry.register(SwitchCollector(driver))
            serve(registry, METRICS_PORT, addr=opts.metrics_addr or node.address)
        async with trio.open_nursery() as nursery:
            await nursery.start(driver.run)
            listeners = await trio.open_tcp_listeners(CONTROL_PORT, host=node.address)
            print(ready, flush=True)
            await trio.serve_listeners(
                partial(_switch_control, topo=topo, driver=driver), listeners
            )
        return
    from collectives.job import collective_handler  # the application layer, on top
    from collectives.metrics import HostCollectiveMetrics

    async with Context.open(host_config(topo, name, opts.tdf, opts.epoch)) as ctx:
        registry = nic_registry(ctx.driver, name)
        collective_metrics = HostCollectiveMetrics(registry)
        if opts.metrics:
            serve(registry, METRICS_PORT, addr=opts.metrics_addr or node.address)
        agent = host_agent(topo, ctx, name)
        handlers = {
            "collective": collective_handler(topo, ctx, name, collective_metrics),
            "stop": _stop_soon,
        }
        async with trio.open_nursery() as nursery:
            await nursery.start(AgentServer(agent, handlers).serve, node.address, CONTROL_PORT)
            print(ready, flush=True)


def switch_stats(driver: SwitchDriver) -> dict[str, Any]:
    """Totals over the switch's ports: what the fabric summary reports."""
    ports = driver.core.ports
    drops: dict[str, int] = {}
    for ps in ports:
        for reason, count in ps.drops.items():
            drops[reason] = drops.get(reason, 0) + count
    return {
        "drops": drops,
        "pfc_tx": sum(sum(ps.pfc_tx) for ps in ports),
        "pfc_rx": sum(sum(ps.pfc_rx) for ps in ports),
        "ecn_marked": sum(sum(ps.ecn_marked) for ps in ports),
        "tx_packets": sum(ps.tx_packets for ps in ports),
        "tx_bytes": sum(ps.tx_bytes for ps in ports),
        "paused_seconds": sum(
            ps.paused_seconds(p, driver.clock.now()) for ps in ports for p in range(8)
        ),
        "storms": sum(sum(row) for row in driver.core.watchdog.storms_detected),
        "late_wakeups": driver.late_wakeups,
        "socket_drops": driver.port.kernel_drops(),
        "down_vnis": [
            cfg.vni for cfg, ps in zip(driver.core.config.ports, ports, strict=True) if not ps.up
        ],
    }


async def _stop_soon(msg: object = None) -> dict[str, object]:
    """``rocev2-emu stop``: end this node as ``docker stop`` or a crash would (SIGTERM, a
    moment after the reply leaves), so users can watch the fabric and the job react."""

    async def later() -> None:
        await trio.sleep(0.1)
        os.kill(os.getpid(), signal.SIGTERM)

    trio.lowlevel.spawn_system_task(later)
    return {"ok": True, "pid": os.getpid()}


async def _switch_control(stream: trio.SocketStream, topo: Topology, driver: SwitchDriver) -> None:
    async def reply(msg: Any) -> Any:
        cmd = msg.get("cmd") if isinstance(msg, dict) else None
        now = driver.clock.now()
        if cmd == "stats":
            return switch_stats(driver)
        if cmd == "set_link":
            driver.core.set_link(int(msg["port"]), bool(msg["up"]), now)
        elif cmd == "set_faults":
            driver.set_faults(int(msg["port"]), LinkFaults(**msg["faults"]))
        elif cmd == "set_routes":
            driver.core.set_routes({int(ip): tuple(p) for ip, p in msg["routes"]})
        elif cmd == "stop":
            return await _stop_soon()
        else:
            return {"error": f"unknown command {msg!r}"}
        return {"ok": True}

    await serve_requests(stream, reply, timeout=3600.0)
