"""The exact process mode, the supervisor's side: every node its own process (or a group of
them) on its own event engine, the links between them real UDP datagrams carrying emulated
time, the windows granted by a coordinator in the supervisor (:mod:`rocev2_emu.runtime.sync`);
the node processes are :mod:`rocev2_emu.fabric.exact_node`.

:class:`ExactFlowsJob` runs a flow job on such a fabric as
:func:`~rocev2_emu.fabric.virtual.run_flows_virtual` runs it in one process: the flows opened
one by one in the order of their ids while the clock is held, started at the same emulated
instant, and the counters read when the fabric is quiet.  The same topology and flows therefore
give the same results and counters as the virtual run, whatever the machine's load.

A change to the fabric asked for in the run (:meth:`ExactEngine.change_links`, e.g. a job's
rank failing spines) reaches every process with a window; a switch applies it at its emulated
instant as the virtual fabric's failures do - its ports on those links down or up, then its
routes converged around every link down so far.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable
from dataclasses import asdict
from typing import Any, Final

import trio
import trio.testing

from rocev2_emu.fabric.agent import (
    FlowResult,
    FlowSpec,
    data_digest,
    flow_data,
)
from rocev2_emu.fabric.control import control
from rocev2_emu.fabric.layout import by_process, open_batches
from rocev2_emu.fabric.report import merge_stats
from rocev2_emu.runtime.coordinator import Coordinator
from rocev2_emu.runtime.sync import sync_label
from rocev2_emu.runtime.sync_messages import SyncError
from rocev2_emu.topology.model import Topology

__all__ = [
    "FLOW_START",
    "Coordinator",
    "ExactFlowsJob",
    "SyncError",
    "ask_nodes",
    "quiet_stats",
    "sync_label",
]

FLOW_START: Final = 1e-3  # emulated seconds: when a flow job's flows start (as in virtual time)


class ExactFlowsJob:
    """The flows on an exact fabric of node processes (see the module); the supervisor runs
    ``coordinator`` beside it."""

    def __init__(
        self, flows: list[FlowSpec], coordinator: Coordinator, t0: float = FLOW_START
    ) -> None:
        self.flows = flows
        self.coordinator = coordinator
        self.t0 = t0

    async def run(
        self, topo: Topology, tdf: float, epoch: float
    ) -> tuple[list[FlowResult], dict[str, Any]]:
        coordinator = self.coordinator
        with trio.fail_after(60):
            await coordinator.connected.wait()
        # one batch at a time, each flow of a batch after the other: every NIC draws its QPNs
        # and PSNs in the flows' order, as in virtual time; a batch is a run of flows whose
        # sources share a process (its hosts call a destination there directly)
        for batch in open_batches(sorted(self.flows, key=lambda f: f.id), coordinator.names):
            flows = [{"spec": asdict(f), "dst": topo.nodes[f.dst].address} for f in batch]
            await _ask(topo, batch[0].src, {"cmd": "open_flows", "flows": flows}, 30 + len(flows))
        sources = sorted({f.src for f in self.flows})
        # the clock is held until released: the sources are told in any order, each process
        # its own, all start at t0; what arrived is checked after the run (no out-of-band wait
        # inside it)
        await ask_nodes(
            topo, coordinator, sources, {"cmd": "start_flows", "t0": self.t0, "verify": False}
        )
        coordinator.release()
        replies = await ask_nodes(
            topo, coordinator, sources, {"cmd": "flow_results"}, timeout=math.inf
        )
        results = [FlowResult(**r) for reply in replies.values() for r in reply["results"]]
        if not topo.timing_only:  # (timing only: the fabric carried no bytes to check)
            await self._verify(topo, results)
        return sorted(results, key=lambda r: r.id), await quiet_stats(topo, coordinator)

    async def _verify(self, topo: Topology, results: list[FlowResult]) -> None:
        """Each flow that ended well is ``verified`` if its destination holds exactly the bytes
        its source wrote (:func:`~rocev2_emu.fabric.agent.flow_data`, by the flow's id): one
        ``digests`` request per destination."""
        specs = {spec.id: spec for spec in self.flows}
        ids: dict[str, list[int]] = {}
        for r in results:
            if r.status == "ok":
                ids.setdefault(r.dst, []).append(r.id)
        dsts = sorted(ids)
        replies = await _gather(
            len(dsts), lambda i: _ask(topo, dsts[i], {"cmd": "digests", "ids": ids[dsts[i]]})
        )
        held = {
            flow_id: digest
            for dst, reply in zip(dsts, replies, strict=True)
            for flow_id, digest in zip(ids[dst], reply["sha256"], strict=True)
        }
        for r in results:
            if r.status == "ok":
                r.verified = held.get(r.id) == data_digest(flow_data(specs[r.id]))

    async def node_died(self, name: str, code: int) -> bool:
        return False


async def quiet_stats(topo: Topology, coordinator: Coordinator) -> dict[str, Any]:
    """Once the fabric is quiet, hold the clock, read every node's counters (as the virtual
    run's summary: with the frame-hops), and end the run."""
    await coordinator.quiet.wait()
    coordinator.hold()
    # each process for its own nodes, MAX_PROCESS_NODES at a time (not a connection per node:
    # 0.9 s of the 1 023 -> 1 incast's 1 344 nodes over two processes)
    asks = by_process(coordinator.names, set(topo.nodes))
    replies = await _ask_each(
        [topo.nodes[names[0]].address for names in asks],
        [{"cmd": "node_stats", "names": names} for names in asks],
    )
    got: dict[str, Any] = {}
    for names, reply in zip(asks, replies, strict=True):
        if not isinstance(reply, dict) or not isinstance(reply.get("nodes"), dict):
            raise SyncError(f"{names[0]}'s process: no node stats ({str(reply)[:200]})")
        got.update(reply["nodes"])
    fabric = merge_stats({name: got[name] for name in topo.nodes})  # the topology's order
    # the frame-hops by process: the nodes of one share its engine, asked once (its first)
    firsts = [topo.nodes[name.split(",")[0]].address for name in coordinator.names]
    states = await _ask_each(firsts, [{"cmd": "engine"}] * len(firsts))
    fabric["frame_hops"] = sum(int(state["frame_hops"]) for state in states)
    await coordinator.finish()
    return fabric


CONCURRENT_REQUESTS: Final = 32  # control requests in flight at once (a server admits 256)


async def _gather(count: int, one: Callable[[int], Awaitable[Any]]) -> list[Any]:
    """``one(i)`` for each ``i < count``, up to :data:`CONCURRENT_REQUESTS` at once: their
    results, in that order."""
    results: list[Any] = [None] * count
    limit = trio.CapacityLimiter(CONCURRENT_REQUESTS)

    async def run(i: int) -> None:
        async with limit:
            results[i] = await one(i)

    async with trio.open_nursery() as nursery:
        for i in range(count):
            nursery.start_soon(run, i)
    return results


async def ask_nodes(
    topo: Topology,
    coordinator: Coordinator,
    names: list[str],
    request: dict[str, Any],
    timeout: float = 30.0,
) -> dict[str, dict[str, Any]]:
    """``request`` to each node of ``names``: a ``for_nodes`` request to each process for its
    nodes among them, in the order the process holds them (the topology's, whatever the order
    of ``names``), :data:`MAX_PROCESS_NODES` at a time, the processes at once; each node's reply
    by name.  A RuntimeError names the first node that answered with an error."""
    asks = by_process(coordinator.names, set(names))
    replies = await _gather(
        len(asks),
        lambda i: _ask(
            topo, asks[i][0], {"cmd": "for_nodes", "names": asks[i], "request": request}, timeout
        ),
    )
    got: dict[str, dict[str, Any]] = {}
    for group, reply in zip(asks, replies, strict=True):
        each = reply.get("replies")
        if not isinstance(each, list) or len(each) != len(group):
            raise SyncError(f"{group[0]}'s process: no reply for each node ({str(reply)[:200]})")
        for name, one in zip(group, each, strict=True):
            if not isinstance(one, dict) or "error" in one:
                why = one.get("error") if isinstance(one, dict) else one
                raise RuntimeError(f"host {name}: {why}")
            got[name] = one
    return got


async def _ask_each(addresses: list[str], msgs: list[dict[str, Any]]) -> list[Any]:
    """``msgs[i]`` to the node at ``addresses[i]``, for each (the clock is held): their replies,
    in order."""
    return await _gather(len(addresses), lambda i: control(addresses[i], msgs[i]))


async def _ask(
    topo: Topology, name: str, msg: dict[str, Any], timeout: float = 30.0
) -> dict[str, Any]:
    with trio.fail_after(timeout):
        reply = await control(topo.nodes[name].address, msg, timeout=min(timeout, 1e6))
    if not isinstance(reply, dict) or "error" in reply:
        raise RuntimeError(
            f"host {name}: {reply.get('error') if isinstance(reply, dict) else reply}"
        )
    return reply
