"""The intra-server fabric on a trio clock or an event engine's heap: deliveries at the model's
instants, in virtual time, and its Prometheus counters."""

from __future__ import annotations

from functools import partial

import trio
import trio.testing
from prometheus_client import CollectorRegistry

from rocev2_emu.runtime.clock import DilatedClock
from rocev2_emu.runtime.engine import Engine
from rocev2_emu.server.crossbar import PRESETS, IntraServerConfig
from rocev2_emu.server.fabric import ServerFabric, host_server_fabric, open_server_fabric


def test_deliveries_land_at_the_models_instants_and_are_counted() -> None:
    registry = CollectorRegistry()
    config = IntraServerConfig("pcie", 8e9, 1e-6)  # 1 GB/s: a 1 MB transfer is 1 ms

    async def main() -> list[tuple[str, float]]:
        clock = DilatedClock(1.0)
        landed: list[tuple[str, float]] = []
        async with open_server_fabric(config, 2, clock, registry=registry, node="h0") as fab:
            done = trio.Event()

            def data() -> None:
                landed.append(("data", clock.now()))
                done.set()

            fab.send(0, 1, 1_000_000, data)
            await trio.sleep(0.5e-3)
            fab.send(1, 0, 0, lambda: landed.append(("flag", clock.now())))
            await done.wait()
        return landed

    landed = trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert [name for name, _ in landed] == ["flag", "data"]
    flag, data = (at for _, at in landed)
    assert abs(flag - (0.5e-3 + 1e-6)) < 1e-9
    assert abs(data - (1e-3 + 1e-6)) < 1e-9

    # the collector leaves the registry with the fabric
    assert (
        registry.get_sample_value(
            "rocev2_server_fabric_tx_bytes_total", {"node": "h0", "accelerator": "0"}
        )
        is None
    )


def test_on_an_engine_the_deliveries_are_its_alarm_at_the_trio_tasks_instants() -> None:
    """Where the host's NIC is an engine's node the fabric has no task: the engine's heap
    delivers, at the instants the trio task delivers at, bit for bit."""
    config = IntraServerConfig("nvlink", 3600e9, 0.5e-6)

    async def main(on_engine: bool) -> list[tuple[int, float]]:
        clock = DilatedClock(1.0)
        landed: list[tuple[int, float]] = []
        engine = Engine() if on_engine else None
        async with trio.open_nursery() as nursery:
            if engine is not None:
                await nursery.start(engine.run)
            async with open_server_fabric(config, 4, clock, engine=engine) as fab:
                assert fab.on_engine is on_engine
                done = trio.Event()

                def land(k: int) -> bool:
                    landed.append((k, clock.now()))
                    if k < 6:  # each delivery writes the next: from inside the heap on an engine
                        fab.send(k % 4, (k + 1) % 4, 1000 * k + 4096, partial(land, k + 3))
                    if len(landed) == 9:
                        done.set()
                    return False

                for k in range(3):
                    fab.send(0, k + 1, 65536 >> k, partial(land, k))
                    await trio.sleep(0.1e-6)
                await done.wait()
            nursery.cancel_scope.cancel()
        return landed

    on_task = trio.run(main, False, clock=trio.testing.MockClock(autojump_threshold=0))
    on_heap = trio.run(main, True, clock=trio.testing.MockClock(autojump_threshold=0))
    assert len(on_task) == 9 and on_heap == on_task


def test_the_collector_reads_the_counters_while_the_fabric_runs() -> None:
    registry = CollectorRegistry()
    config = IntraServerConfig("nvlink", 8e9, 0.0)  # 1 GB/s

    def sample(name: str, accelerator: str, **more: str) -> float | None:
        labels = {"node": "h0", "accelerator": accelerator, **more}
        return registry.get_sample_value(f"rocev2_server_fabric_{name}_total", labels)

    async def main() -> list[float | None]:
        clock = DilatedClock(1.0)
        async with open_server_fabric(config, 2, clock, registry=registry, node="h0") as fab:
            done = trio.Event()
            fab.send(0, 1, 1_000_000, done.set)
            await done.wait()
            return [
                sample("tx_bytes", "0"),
                sample("rx_bytes", "1"),
                sample("rx_bytes", "0"),
                sample("busy_seconds", "0", direction="tx"),
                sample("busy_seconds", "1", direction="tx"),
            ]

    got = trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert got[:3] == [1_000_000, 1_000_000, 0]
    assert got[3] is not None and abs(got[3] - 1e-3) < 1e-12  # 1 MB at 1 GB/s
    assert got[4] == 0


def test_a_free_fabric_delivers_at_once_and_needs_no_clock() -> None:
    fab = ServerFabric(PRESETS["free"], 4)
    landed: list[int] = []
    fab.send(0, 1, 1 << 20, lambda: landed.append(1))
    assert landed == [1]


def test_a_hosts_fabric_is_shared_by_its_jobs_and_counts_across_them() -> None:
    """Two jobs' transfers on one host's fabric (host_server_fabric) contend for the same pair
    of ports, and its counters run on from one to the other."""
    registry = CollectorRegistry()
    config = IntraServerConfig("pcie", 8e9, 0.0)  # 1 GB/s: 1 MB alone takes 1 ms

    async def job(fab: ServerFabric, clock: DilatedClock, landed: list[float]) -> None:
        done = trio.Event()
        fab.send(0, 1, 1_000_000, done.set)
        await done.wait()
        landed.append(clock.now())

    async def main() -> list[float]:
        clock = DilatedClock(1.0)
        fab = host_server_fabric(config, 2, clock, registry=registry, node="h0")
        landed: list[float] = []
        async with trio.open_nursery() as nursery:  # two jobs at once, one port 0 -> 1
            nursery.start_soon(job, fab, clock, landed)
            nursery.start_soon(job, fab, clock, landed)
        return landed

    landed = trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    # one pair, first in first out: the second job's transfer waits for the first one's
    assert [round(t * 1e3, 6) for t in landed] == [1.0, 2.0]
    labels = {"node": "h0", "accelerator": "0"}
    assert registry.get_sample_value("rocev2_server_fabric_tx_bytes_total", labels) == 2e6
