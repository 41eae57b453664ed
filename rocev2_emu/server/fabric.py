"""A server's intra-server fabric on the host's emulated clock, and its Prometheus metrics.

:class:`ServerFabric` drives a :class:`~rocev2_emu.server.crossbar.Crossbar` and calls each
transfer's delivery when it lands.  Where the host's NIC is a node of an event engine (virtual
and exact runs) the model's next change is an :class:`~rocev2_emu.runtime.events.Alarm` on the
engine's heap: deliveries run inside the engine, before the other events of their instant, with
no trio task, cancel scope or scheduler round trip per transfer.  On the wall clock one trio
task sleeps until the model's next change on the host's :class:`DilatedClock`.  With the
``free`` fabric a transfer is delivered at once, as shared memory was before there was a model.

Metrics (a custom collector reading the model's counters at scrape time), labels ``node`` and
``accelerator`` (the local rank): ``rocev2_server_fabric_tx_bytes_total``,
``rocev2_server_fabric_rx_bytes_total``, and ``rocev2_server_fabric_busy_seconds_total`` with a
``direction`` label (emulated seconds the port was moving data: its utilisation is the rate).
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager

import trio
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from rocev2_emu.runtime.clock import DilatedClock
from rocev2_emu.runtime.engine import Engine, ModelAlarm
from rocev2_emu.server.crossbar import Crossbar, IntraServerConfig


class ServerFabric:
    """The fabric joining ``ports`` accelerators of one server, on ``clock`` (a free fabric
    needs none); on ``engine``'s heap when the host's NIC is one of its nodes."""

    def __init__(
        self,
        config: IntraServerConfig,
        ports: int,
        clock: DilatedClock | None = None,
        engine: Engine | None = None,
    ) -> None:
        self.config = config
        self.model = (
            Crossbar(ports, config.bandwidth_bps / 8, config.latency)
            if config.modelled(ports)
            else None
        )
        if self.model is not None and clock is None:
            raise ValueError(f"a {config.kind} fabric runs on a clock: give it the host's")
        self.clock = clock
        self.engine = engine if self.model is not None else None
        # exactly one drives a modelled fabric: an alarm on the engine, or a task on the clock
        self._alarm: ModelAlarm | None = None
        self._task: _WallClockTask | None = None
        if self.model is not None and clock is not None:
            if self.engine is not None:
                self._alarm = ModelAlarm(self.engine, clock.now, self.model.next_time, self._due)
            else:
                self._task = _WallClockTask(self.model, clock)
        self._firing = False  # delivering: the alarm is armed once, after the deliveries

    def send(self, src: int, dst: int, size: int, on_delivered: Callable[[], object]) -> bool:
        """Move ``size`` bytes from accelerator ``src`` to ``dst``; ``on_delivered`` runs when
        they land (at once on a free fabric).  True if trio must run before time moves on: the
        fabric's task now sleeps until a new deadline (on the wall clock; a caller inside the
        event engine hands it control), or ``on_delivered`` said so (it woke a task)."""
        if self.model is None or self.clock is None:
            return bool(on_delivered())
        self.model.send(src, dst, size, self.clock.now(), on_delivered)
        if self._alarm is not None:
            if not self._firing:
                self._alarm.rearm()
            return False
        if self._task is not None:
            self._task.arm()
        return True

    @property
    def on_engine(self) -> bool:
        """Its deliveries are an alarm on an engine's heap (no task to run)."""
        return self._alarm is not None

    def close(self) -> None:
        """Deliver nothing more (the end of a job's own fabric)."""
        if self._alarm is not None:
            self._alarm.stop()

    def _due(self, now: float) -> bool:
        """The alarm: deliver what lands by ``now``; True if a delivery woke a task."""
        assert self.model is not None
        woke = False
        self._firing = True
        try:
            for deliver in self.model.advance(now):
                if deliver():
                    woke = True
        finally:
            self._firing = False
        return woke

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Deliver each transfer when it lands, until cancelled (on an engine, or with a free
        fabric, only sleeps: the heap runs the deliveries, or there are none to run)."""
        task_status.started()
        if self._task is None:
            await trio.sleep_forever()
            return
        await self._task.run()


class _WallClockTask:
    """A crossbar's deliveries on the wall clock: one trio task sleeps until the model's next
    change, its deadline moved whenever a transfer starts."""

    def __init__(self, model: Crossbar, clock: DilatedClock) -> None:
        self.model = model
        self.clock = clock
        self._scope: trio.CancelScope | None = None
        self._target = math.inf  # the emulated instant the task sleeps until

    def arm(self) -> None:
        nxt = self.model.next_time()
        self._target = math.inf if nxt is None else nxt
        if self._scope is not None:
            self._scope.deadline = math.inf if nxt is None else self.clock.to_trio(nxt)

    async def run(self) -> None:
        model, clock = self.model, self.clock
        while True:
            with trio.CancelScope() as scope:
                self._scope = scope
                self.arm()
                await trio.sleep_forever()
            self._scope = None
            now = clock.now()
            if self._target != math.inf:
                now = max(now, self._target)  # the instant slept to, not a rounding before it
            for deliver in model.advance(now):
                deliver()


@asynccontextmanager
async def open_server_fabric(
    config: IntraServerConfig,
    ports: int,
    clock: DilatedClock,
    *,
    engine: Engine | None = None,
    registry: CollectorRegistry | None = None,
    node: str = "",
) -> AsyncIterator[ServerFabric]:
    """A running :class:`ServerFabric` for the block (its metrics on ``registry`` if given): a
    job's own, in virtual time; a host process keeps one (:func:`host_server_fabric`).  On
    ``engine`` it has no task; what it has not delivered when the block ends is dropped, as
    the task's cancellation drops it."""
    fabric = ServerFabric(config, ports, clock, engine)
    collector = None
    if registry is not None and fabric.model is not None:
        collector = ServerFabricCollector(fabric, node)
        registry.register(collector)
    try:
        if fabric.on_engine:
            yield fabric
        else:
            async with trio.open_nursery() as nursery:
                await nursery.start(fabric.run)
                yield fabric
                nursery.cancel_scope.cancel()
    finally:
        fabric.close()
        if collector is not None and registry is not None:
            registry.unregister(collector)


def host_server_fabric(
    config: IntraServerConfig,
    ports: int,
    clock: DilatedClock,
    *,
    engine: Engine | None = None,
    registry: CollectorRegistry | None = None,
    node: str = "",
) -> ServerFabric:
    """A host process's fabric for the rest of its trio run (a system task, or an alarm on
    ``engine``), its metrics on ``registry``: one per host, so that concurrent jobs on it share
    - and contend for - its links, and its counters run on from job to job."""
    fabric = ServerFabric(config, ports, clock, engine)
    if registry is not None and fabric.model is not None:
        registry.register(ServerFabricCollector(fabric, node))
    if not fabric.on_engine:
        trio.lowlevel.spawn_system_task(fabric.run, name=f"server fabric of {node or 'a host'}")
    return fabric


class ServerFabricCollector(Collector):
    """The fabric's counters as of its last change (a transfer started, sent or delivered),
    read when scraped."""

    def __init__(self, fabric: ServerFabric, node: str) -> None:
        self.fabric = fabric
        self.node = node

    def collect(self) -> Iterator[CounterMetricFamily]:
        model = self.fabric.model
        if model is None:
            return
        labels = ["node", "accelerator"]
        tx = CounterMetricFamily(
            "rocev2_server_fabric_tx_bytes",
            "Bytes sent into the intra-server fabric",
            labels=labels,
        )
        rx = CounterMetricFamily(
            "rocev2_server_fabric_rx_bytes",
            "Bytes delivered by the intra-server fabric",
            labels=labels,
        )
        busy = CounterMetricFamily(
            "rocev2_server_fabric_busy_seconds",
            "Emulated seconds an accelerator's fabric port moved data, per direction",
            labels=[*labels, "direction"],
        )
        for port in range(model.ports):
            acc = str(port)
            tx.add_metric([self.node, acc], model.tx_bytes[port])
            rx.add_metric([self.node, acc], model.rx_bytes[port])
            busy.add_metric([self.node, acc, "tx"], model.tx_busy[port])
            busy.add_metric([self.node, acc, "rx"], model.rx_busy[port])
        yield tx
        yield rx
        yield busy
