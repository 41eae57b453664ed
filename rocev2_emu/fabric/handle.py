"""What a job on node processes does with their fabric, whatever its clock.

A job (:class:`~rocev2_emu.fabric.flows.FlowsJob`) asks nodes over their control ports, starts
its work at an emulated instant, lets the clock run and reads the counters once the work is
done.  :class:`ExactFabric` does each of those on the exact clock (requests grouped by
process, the clock held until :meth:`release`, the counters read once the fabric is quiet,
:mod:`rocev2_emu.fabric.exact`); :class:`WallFabric` on the dilated wall clock (a request per
node; the clock never stops).  The virtual run needs none: its job calls the agents in its
own process (:func:`~rocev2_emu.fabric.flows.run_flows`).
"""

from __future__ import annotations

from typing import Any, Protocol

import trio

from rocev2_emu.fabric.control import control
from rocev2_emu.fabric.exact import SyncError, ask_node, ask_nodes, gather, quiet_stats
from rocev2_emu.fabric.report import merge_stats
from rocev2_emu.runtime.clock import DilatedClock
from rocev2_emu.runtime.coordinator import Coordinator
from rocev2_emu.topology.model import Topology

JOIN_SECONDS = 60.0  # wall seconds for every process of an exact run to join its coordinator
START_AHEAD = 0.5  # wall seconds from the wall clock's start request to its work's start


class Fabric(Protocol):
    """The node processes a job runs on."""

    processes: list[str]  # each named by its nodes (topology.processes.process_name)

    async def joined(self) -> None:
        """Until every process is in (a SyncError naming the missing after a deadline)."""
        ...

    async def ask(
        self, names: list[str], request: dict[str, Any], timeout: float = 30.0
    ) -> dict[str, dict[str, Any]]:
        """``request`` to each node of ``names``: each one's reply, by name."""
        ...

    def start_at(self, t0: float) -> float:
        """The emulated instant work asked to start at ``t0`` starts."""
        ...

    def release(self) -> None:
        """The work is set up: let the clock run."""
        ...

    async def stats(self) -> dict[str, Any]:
        """Every node's counters once the work is done, merged (the fabric summary)."""
        ...


class ExactFabric:
    """The node processes of an exact run, synchronised by ``coordinator``; each must join
    it within ``join_timeout`` wall seconds."""

    def __init__(
        self, topo: Topology, coordinator: Coordinator, join_timeout: float = JOIN_SECONDS
    ) -> None:
        self.topo = topo
        self.coordinator = coordinator
        self.join_timeout = join_timeout
        self.processes = coordinator.names

    async def joined(self) -> None:
        with trio.move_on_after(self.join_timeout):
            await self.coordinator.connected.wait()
        if not self.coordinator.connected.is_set():
            raise SyncError(
                f"node processes not joined within {self.join_timeout:g} s: "
                + ", ".join(self.coordinator.missing())
            )

    async def ask(
        self, names: list[str], request: dict[str, Any], timeout: float = 30.0
    ) -> dict[str, dict[str, Any]]:
        return await ask_nodes(self.topo, self.coordinator, names, request, timeout)

    def start_at(self, t0: float) -> float:
        return t0  # the clock is held at 0 until released

    def release(self) -> None:
        self.coordinator.release()

    async def stats(self) -> dict[str, Any]:
        return await quiet_stats(self.topo, self.coordinator)


class WallFabric:
    """One process per node on the wall clock dilated by ``tdf`` from ``epoch``."""

    def __init__(self, topo: Topology, tdf: float, epoch: float) -> None:
        self.topo = topo
        self.clock = DilatedClock(tdf, epoch=epoch)
        self.processes = list(topo.nodes)

    async def joined(self) -> None:
        return None  # the supervisor has waited for every node's READY

    async def ask(
        self, names: list[str], request: dict[str, Any], timeout: float = 30.0
    ) -> dict[str, dict[str, Any]]:
        replies = await gather(
            len(names), lambda i: ask_node(self.topo, names[i], request, timeout)
        )
        return dict(zip(names, replies, strict=True))

    def start_at(self, t0: float) -> float:
        return self.clock.now() + START_AHEAD / self.clock.tdf  # the clock runs meanwhile

    def release(self) -> None:
        return None

    async def stats(self) -> dict[str, Any]:
        nodes = self.topo.nodes.values()
        return merge_stats({n.name: await control(n.address, {"cmd": "stats"}) for n in nodes})


def fabric_for(
    topo: Topology,
    tdf: float,
    epoch: float,
    coordinator: Coordinator | None,
    join_timeout: float = JOIN_SECONDS,
) -> Fabric:
    """The fabric a job runs on: exact with a coordinator (its processes joining within
    ``join_timeout`` wall seconds), else the wall clock's."""
    if coordinator is not None:
        return ExactFabric(topo, coordinator, join_timeout)
    return WallFabric(topo, tdf, epoch)
