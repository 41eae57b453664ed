"""A switch process: the pipeline and its driver on one UDP socket, its metrics, and its
control server.

The fabric (:mod:`rocev2_emu.fabric.nodes`) works out from the topology what this module needs
- the pipeline's configuration, each port's peer address and link faults - so the switch knows
nothing of topology files.  The control server answers ``stats`` (the switch's share of the
fabric summary), ``ports`` (each port now: the live map's), ``set_link`` (a port down or up),
``set_faults`` (a port's link faults), ``set_routes`` (after links changed elsewhere) and
``stop``: one table (:func:`control_table`) of typed requests, each decoded and checked by
:mod:`rocev2_emu.control.requests` (an error names the field).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import trio
from prometheus_client import CollectorRegistry

from rocev2_emu.control import auth
from rocev2_emu.control.channel import connection_limit, serve_requests, stop_soon
from rocev2_emu.control.requests import Table, serve_table
from rocev2_emu.runtime.clock import DilatedClock, lateness_stats
from rocev2_emu.runtime.link import LinkFaults, faults_from_request
from rocev2_emu.runtime.metrics import serve
from rocev2_emu.runtime.ports import UdpPort
from rocev2_emu.wire.qos import PRIORITIES
from switch.config import SwitchConfig
from switch.driver import EngineSwitch, SwitchDriver
from switch.metrics import SwitchCollector
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
    now = driver.clock.now()
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
        "paused_seconds": sum(ps.paused_seconds(p, now) for ps in ports for p in range(PRIORITIES)),
        "storms": sum(sum(row) for row in driver.core.watchdog.storms_detected),
        **lateness_stats(driver),
        "socket_drops": driver.port.kernel_drops(),
        "down_vnis": [
            cfg.vni for cfg, ps in zip(driver.core.config.ports, ports, strict=True) if not ps.up
        ],
    }


# -- the control requests (rocev2_emu.control.requests decodes and checks them) --------------
@dataclass(frozen=True, slots=True)
class Stats:
    """The switch's totals: its share of the fabric summary."""


@dataclass(frozen=True, slots=True)
class Ports:
    """Each port now (the live map's view)."""


@dataclass(frozen=True, slots=True)
class SetLink:
    """Take the link on ``port`` down (its queues are lost) or up."""

    port: int
    up: bool


@dataclass(frozen=True, slots=True)
class SetFaults:
    """The link faults of the link on ``port`` (LinkFaults' fields, as numbers)."""

    port: int
    faults: dict[str, Any]


@dataclass(frozen=True, slots=True)
class SetRoutes:
    """Every route anew: ``[[host IPv4 as an integer, [egress port, ...]], ...]``."""

    routes: list[Any]

    def __post_init__(self) -> None:
        for i, entry in enumerate(self.routes):
            ok = (
                isinstance(entry, list | tuple)
                and len(entry) == 2
                and isinstance(entry[0], int)
                and isinstance(entry[1], list | tuple)
                and all(isinstance(p, int) and not isinstance(p, bool) for p in entry[1])
            )
            if not ok:
                raise ValueError(f"routes[{i}]: {entry!r} is not [host ip, [port, ...]]")


@dataclass(frozen=True, slots=True)
class Stop:
    """End the switch process (as a crash would), after this reply."""


async def serve_control(
    stream: trio.SocketStream, driver: SwitchDriver, secret: bytes | None = None
) -> None:
    """One control connection to the switch; the client must prove ``secret`` (default: this
    process's fabric secret)."""
    await serve_requests(
        stream, control_replies(driver), timeout=3600.0, secret=secret or auth.current()
    )


def control_table(driver: SwitchDriver | EngineSwitch) -> Table:
    """The switch's commands: request type and handler for each."""
    core = driver.core

    def port_of(port: int) -> int:
        if not 0 <= port < len(core.ports):
            raise ValueError(f"port {port}: the switch has ports 0 to {len(core.ports) - 1}")
        return port

    async def stats(_: Stats) -> dict[str, Any]:
        return switch_stats(driver)

    async def ports(_: Ports) -> dict[str, Any]:
        return port_states(driver)

    async def set_link(req: SetLink) -> dict[str, Any]:
        core.set_link(port_of(req.port), req.up, driver.clock.now())
        return {"ok": True}

    async def set_faults(req: SetFaults) -> dict[str, Any]:
        driver.set_faults(port_of(req.port), faults_from_request(req.faults))
        return {"ok": True}

    async def set_routes(req: SetRoutes) -> dict[str, Any]:
        core.set_routes({ip: tuple(ports) for ip, ports in req.routes})
        return {"ok": True}

    async def stop(_: Stop) -> dict[str, Any]:
        return await stop_soon()

    return {
        "stats": (Stats, stats),
        "ports": (Ports, ports),
        "set_link": (SetLink, set_link),
        "set_faults": (SetFaults, set_faults),
        "set_routes": (SetRoutes, set_routes),
        "stop": (Stop, stop),
    }


def control_replies(
    driver: SwitchDriver | EngineSwitch, more: Table | None = None
) -> Callable[[Any], Awaitable[Any]]:
    """The switch's answer to each control request (``more``: further rows, which take
    precedence: the exact mode's ``engine``, ``change_links`` and its refusals)."""
    table = {**control_table(driver), **(more or {})}

    async def reply(msg: Any) -> Any:
        return await serve_table(table, msg)

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
