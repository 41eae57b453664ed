"""The exact process mode, the supervisor's side: every node its own process (or a group of
them) on its own event engine, the links between them real UDP datagrams carrying emulated
time, the windows granted by a coordinator in the supervisor (:mod:`rocev2_emu.runtime.sync`);
the node processes are :mod:`rocev2_emu.fabric.exact_node`.

Here are the requests a job makes of such a fabric (:class:`~rocev2_emu.fabric.handle.ExactFabric`
wraps them): to nodes grouped by process (:func:`ask_nodes`), and the counters once the fabric
is quiet (:func:`quiet_stats`).  A flows job (:class:`~rocev2_emu.fabric.flows.FlowsJob`) opens
its flows one by one in the order of their ids while the clock is held and starts them at one
emulated instant, so it gives the virtual run's results and counters whatever the load.

A change to the fabric asked for in the run (:meth:`ExactEngine.change_links`, e.g. a job's
rank failing spines) reaches every process with a window; a switch applies it at its emulated
instant as the virtual fabric's failures do - its ports on those links down or up, then its
routes converged around every link down so far.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Final

import trio
import trio.testing

from rocev2_emu.fabric.agent_server import for_node, node_reply
from rocev2_emu.fabric.control import control
from rocev2_emu.fabric.layout import PROCESS_COMMANDS, by_process
from rocev2_emu.fabric.report import merge_stats
from rocev2_emu.runtime.coordinator import Coordinator
from rocev2_emu.runtime.sync import sync_label
from rocev2_emu.runtime.sync_messages import SyncError, process_label
from rocev2_emu.topology.model import Topology
from rocev2_emu.verbs.oob import OobError

__all__ = [
    "Coordinator",
    "SyncError",
    "ask_node",
    "ask_nodes",
    "gather",
    "quiet_stats",
    "sync_label",
]


async def quiet_stats(topo: Topology, coordinator: Coordinator) -> dict[str, Any]:
    """Once the fabric is quiet, hold the clock, read every node's counters (as the virtual
    run's summary: with the frame-hops), and end the run."""
    await coordinator.quiet.wait()
    coordinator.hold()
    # each process for its own nodes, MAX_PROCESS_NODES at a time (not a connection per node:
    # 0.9 s of the 1 023 -> 1 incast's 1 344 nodes over two processes)
    asks = by_process(coordinator.names, set(topo.nodes))
    replies = await _ask_each(
        topo,
        [names[0] for names in asks],
        [{"cmd": "node_stats", "names": names} for names in asks],
    )
    got: dict[str, Any] = {}
    for names, reply in zip(asks, replies, strict=True):
        if not isinstance(reply, dict) or not isinstance(reply.get("nodes"), dict):
            raise SyncError(f"{names[0]}'s process: no node stats ({str(reply)[:200]})")
        got.update(reply["nodes"])
    fabric = merge_stats({name: got[name] for name in topo.nodes})  # the topology's order
    # the frame-hops by process: the nodes of one share its engine, asked once (its first)
    firsts = [name.split(",")[0] for name in coordinator.names]
    states = await _ask_each(topo, firsts, [{"cmd": "engine"}] * len(firsts))
    fabric["frame_hops"] = sum(int(state["frame_hops"]) for state in states)
    await coordinator.finish()
    return fabric


CONCURRENT_REQUESTS: Final = 32  # control requests in flight at once (a server admits 256)


async def gather(count: int, one: Callable[[int], Awaitable[Any]]) -> list[Any]:
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
    replies = await gather(
        len(asks),
        lambda i: _joined(
            asks[i][0],
            ask_node(
                topo,
                asks[i][0],
                {"cmd": "for_nodes", "names": asks[i], "request": request},
                timeout,
            ),
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


async def _ask_each(topo: Topology, names: list[str], msgs: list[dict[str, Any]]) -> list[Any]:
    """``msgs[i]`` to node ``names[i]``, for each (the clock is held): their replies, in
    order."""
    return await gather(
        len(names), lambda i: _joined(names[i], control(topo.nodes[names[i]].address, msgs[i]))
    )


async def _joined(name: str, request: Awaitable[Any]) -> Any:
    """A request to a node that joined the run: a connection it breaks or refuses means its
    process went away, named as the coordinator names it (whichever of the two sees it first)."""
    try:
        return await request
    except OobError as exc:
        raise SyncError(f"node {process_label(name)} went away ({exc})", name) from exc


async def ask_node(
    topo: Topology, name: str, msg: dict[str, Any], timeout: float = 30.0
) -> dict[str, Any]:
    """``msg`` to node ``name`` at its control port; a node sharing its address with others
    (a swarm stack's worker) through its process's ``for_nodes``."""
    wrapped = topo.shares_address(name) and msg.get("cmd") not in PROCESS_COMMANDS
    if wrapped:
        msg = for_node(name, msg)
    with trio.fail_after(timeout):
        reply = await control(topo.nodes[name].address, msg, timeout=min(timeout, 1e6))
    if wrapped:
        reply = node_reply(reply)
    if not isinstance(reply, dict) or "error" in reply:
        raise RuntimeError(
            f"host {name}: {reply.get('error') if isinstance(reply, dict) else reply}"
        )
    return reply
