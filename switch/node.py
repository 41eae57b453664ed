"""A switch process: the pipeline and its driver on one UDP socket, its metrics, and its
control server.

The fabric (:mod:`rocev2_emu.fabric.nodes`) works out from the topology what this module needs
- the pipeline's configuration, each port's peer address and link faults - so the switch knows
nothing of topology files.  The control server answers ``stats`` (the switch's share of the
fabric summary), ``ports`` (each port now: the live map's), ``set_link`` (a port down or up),
``set_faults`` (a port's link faults), ``set_routes`` (after links changed elsewhere) and
``stop``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

import trio
from prometheus_client import CollectorRegistry

from rocev2_emu.runtime import auth
from rocev2_emu.runtime.clock import DilatedClock, lateness_stats
from rocev2_emu.runtime.control import connection_limit, serve_requests, stop_soon
from rocev2_emu.runtime.link import LinkFaults, faults_from_request
from rocev2_emu.runtime.metrics import serve
from rocev2_emu.runtime.ports import UdpPort
from switch.config import SwitchConfig
from switch.driver import EngineSwitch, SwitchDriver
from switch.metrics import SwitchCollector
from switch.mmu import PRIORITIES
from switch.pipeline import SwitchCore


def port_states(driver: SwitchDriver | EngineSwitch, now: float | None = None) -> dict[str, Any]:
    """Each port now, for a live view of the fabric (``rocev2-emu up --ui``): bytes sent, the
    egress queue's depth (all priorities), whether the neighbour's XOFF is in force on any
    priority of its egress, pause frames it sent, ECN marks, drops, up; and emulated ``now``
    (given: the instant a virtual run's observer sees, which the clock may not show yet)."""
    now = driver.clock.now() if now is None else now
    return {
        "now": now,
        "ports": [
            {
                "tx_bytes": ps.tx_bytes,
                "queue_bytes": sum(ps.queue_bytes),
                "paused": any(until > now for until in ps.paused_until),
                "pfc_tx": sum(ps.pfc_tx),
                "ecn_marked": sum(ps.ecn_marked),
                "drops": sum(ps.drops.values()),
                "up": ps.up,
            }
            for ps in driver.core.ports
        ],
    }


def switch_stats(driver: SwitchDriver | EngineSwitch) -> dict[str, Any]:
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
        "peak_queue_bytes": max((ps.peak_queue_bytes for ps in ports), default=0),
        "port_tx_bytes": [ps.tx_bytes for ps in ports],
        "paused_seconds": sum(
            ps.paused_seconds(p, driver.clock.now()) for ps in ports for p in range(PRIORITIES)
        ),
        "storms": sum(sum(row) for row in driver.core.watchdog.storms_detected),
        **lateness_stats(driver),
        "socket_drops": driver.port.kernel_drops(),
        "down_vnis": [
            cfg.vni for cfg, ps in zip(driver.core.config.ports, ports, strict=True) if not ps.up
        ],
    }


Handler = Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]


async def serve_control(
    stream: trio.SocketStream, driver: SwitchDriver, secret: bytes | None = None
) -> None:
    """One control connection to the switch; the client must prove ``secret`` (default: this
    process's fabric secret)."""
    await serve_requests(
        stream, control_replies(driver), timeout=3600.0, secret=secret or auth.current()
    )


def control_replies(
    driver: SwitchDriver | EngineSwitch, more: dict[str, Handler] | None = None
) -> Callable[[Any], Awaitable[Any]]:
    """The switch's answer to each control request (``more``: further commands, which take
    precedence: the exact mode's ``engine`` and its refusals)."""
    extra = more or {}

    async def reply(msg: Any) -> Any:
        cmd = msg.get("cmd") if isinstance(msg, dict) else None
        if cmd in extra:
            return await extra[cmd](msg)
        now = driver.clock.now()
        if cmd == "stats":
            return switch_stats(driver)
        if cmd == "ports":
            return port_states(driver)
        if cmd == "set_link":
            driver.core.set_link(int(msg["port"]), bool(msg["up"]), now)
        elif cmd == "set_faults":
            driver.set_faults(int(msg["port"]), faults_from_request(msg["faults"]))
        elif cmd == "set_routes":
            driver.core.set_routes({int(ip): tuple(p) for ip, p in msg["routes"]})
        elif cmd == "stop":
            return await stop_soon()
        else:
            return {"error": f"unknown command {msg!r}"}
        return {"ok": True}

    return reply


async def run_switch(
    config: SwitchConfig,
    address: str,
    vxlan_port: int,
    peers: list[tuple[str, int]],
    faults: list[LinkFaults],
    clock: DilatedClock,
    *,
    control_port: int,
    metrics: tuple[str, int] | None,
    ready: str,
    batch_io: bool = True,
) -> None:
    """Run the switch on ``address`` until cancelled; print ``ready`` once it is serving
    (its ``{batch_io}`` filled with the batched I/O in use).  ``batch_io``: UDP GSO/GRO on its
    socket where the kernel has them."""
    secret = auth.current()  # no secret, no switch: fail before serving anything
    port = UdpPort((address, vxlan_port), batch=batch_io)
    driver = SwitchDriver(SwitchCore(config), port, clock, peers, faults)
    if metrics is not None:
        registry = CollectorRegistry()
        registry.register(SwitchCollector(driver))
        serve(registry, metrics[1], addr=metrics[0])
    async with trio.open_nursery() as nursery:
        await nursery.start(driver.run)
        listeners = await trio.open_tcp_listeners(control_port, host=address)
        print(ready.format(batch_io=port.batch_mode), flush=True)
        await trio.serve_listeners(
            connection_limit(partial(serve_control, driver=driver, secret=secret)), listeners
        )
