"""Steering a running fabric from outside: a request to one node's control port (or many over
connections kept open, :class:`ControlPool`), links down and up (with the routes recomputed
around them; on an exact run at one emulated instant), link faults, and stopping one node.

Works on any running fabric - ``rocev2-emu up``'s processes or the compose testbed's
containers - since it needs only the topology file and each node's control port.
"""

from __future__ import annotations

from typing import Any

import trio

from rocev2_emu.control import auth
from rocev2_emu.fabric.agent import CONTROL_PORT
from rocev2_emu.fabric.changes import fault_settings
from rocev2_emu.runtime.link import faults_from_request
from rocev2_emu.topology.model import NodeKind, Topology, TopologyError
from rocev2_emu.verbs.oob import OobChannel, OobError


async def control(address: str, msg: dict[str, Any], *, timeout: float = 10.0) -> Any:
    """One request to the node at ``address`` and its reply."""
    try:
        chan = await OobChannel.connect(
            address, CONTROL_PORT, timeout=timeout, secret=auth.current()
        )
    except OobError as exc:
        raise OobError(f"{exc}: is the fabric running (rocev2-emu up, or the testbed)?") from exc
    try:
        await chan.send(msg)
        return await chan.recv()
    finally:
        await chan.aclose()


class ControlPool:
    """Requests to nodes' control ports over connections kept open, one per node: for a client
    that asks every node again and again (the live map, twice a second), which would otherwise
    make each node accept a connection, authenticate it and close it per request.  A
    connection that fails or whose request is cancelled is dropped and made again next time."""

    def __init__(self, *, timeout: float = 10.0) -> None:
        self.timeout = timeout
        self.connects = 0  # connections made so far (one per node while all goes well)
        self._chans: dict[str, OobChannel] = {}

    async def ask(self, address: str, msg: dict[str, Any]) -> Any:
        """One request to the node at ``address`` and its reply, as :func:`control`."""
        chan = self._chans.pop(address, None)  # taken: a concurrent ask opens its own
        if chan is None:
            try:
                chan = await OobChannel.connect(
                    address, CONTROL_PORT, timeout=self.timeout, secret=auth.current()
                )
            except OobError as exc:
                raise OobError(f"{exc}: is the fabric running?") from exc
            self.connects += 1
        try:
            await chan.send(msg)
            reply = await chan.recv()
        except BaseException:  # the stream's state is unknown: never reuse it
            with trio.CancelScope(shield=True):
                await chan.aclose()
            raise
        old = self._chans.setdefault(address, chan)
        if old is not chan:
            await chan.aclose()
        return reply

    async def aclose(self) -> None:
        chans, self._chans = list(self._chans.values()), {}
        with trio.CancelScope(shield=True):
            for chan in chans:
                await chan.aclose()


def attach(topo: Topology) -> None:
    """Steer (or run a job on) the running fabric of ``topo``: use its secret, found from the
    topology file as its nodes found it (:func:`rocev2_emu.control.auth.load`)."""
    auth.use_fabric(topo.path)


async def set_links(topo: Topology, pairs: list[tuple[str, str]], up: bool) -> str:
    """Take the links between each pair of ``pairs`` down (or up) at once, then reroute every
    switch around what is down in the fabric, as a routing protocol would converge.  On an
    exact run (``--clock exact``) one ``change_links`` request does it all at one emulated
    instant, which the answer names; on the wall clock each switch is told in turn."""
    links = [topo.link_between(a, b) for a, b in pairs]
    state = "up" if up else "down"
    named = ", ".join(f"{lk.a} <-> {lk.b} (VNI {lk.vni})" for lk in links)
    at = await change_links_at_once(topo, pairs, up)
    if at is not None:
        us = at * 1e6
        return f"link {named} is {state} from t={us:.3f} us emulated (exact run: every switch then)"
    down: set[int] = set()
    for sw in topo.switches:  # the fabric's state lives in its switches
        stats = await control(sw.address, {"cmd": "stats"})
        down |= {vni - 1 for vni in stats.get("down_vnis", [])}
    for link in links:
        (down.discard if up else down.add)(link.index)
        for end in (link.a, link.b):
            if topo.nodes[end].kind is NodeKind.SWITCH:
                msg = {"cmd": "set_link", "port": topo.port_of(end, link), "up": up}
                await control(topo.nodes[end].address, msg)
    for sw in topo.switches:  # routing converges around the failure
        routes = topo.routes_by_ip(sw.name, frozenset(down))
        await control(sw.address, {"cmd": "set_routes", "routes": list(routes.items())})
    return f"link {named} is {state}; {len(down)} link(s) down in the fabric"


async def change_links_at_once(
    topo: Topology,
    pairs: list[tuple[str, str]],
    up: bool,
    faults: dict[str, float] | None = None,
) -> float | None:
    """On an exact run: the links between ``pairs`` down (or up; or taking ``faults``) at the
    first emulated instant the run can take it, everywhere at once (one ``change_links``
    request to a node); that instant.  None if the fabric runs on the wall clock (its nodes
    know no such request)."""
    first = topo.switches[0] if topo.switches else topo.nodes[pairs[0][0]]
    msg: dict[str, Any] = {"cmd": "change_links", "pairs": [list(p) for p in pairs], "up": up}
    if faults is not None:
        msg["faults"] = faults
    reply = await control(first.address, msg, timeout=30.0)
    if isinstance(reply, dict) and "at" in reply:
        return float(reply["at"])
    if isinstance(reply, dict) and "unknown command" in str(reply.get("error")):
        return None
    raise RuntimeError(f"change_links at {first.name}: {reply!r:.200}")


def set_link(topo: Topology, a: str, b: str, up: bool) -> int:
    """``rocev2-emu link``: take a link of a running fabric down or up, and reroute."""
    attach(topo)
    print(trio.run(set_links, topo, [(a, b)], up))
    return 0


async def set_link_faults(topo: Topology, a: str, b: str, faults: dict[str, float]) -> str:
    """Change link a-b's faults (loss, delay, ...) at both ends of a running fabric."""
    link = topo.link_between(a, b)
    settings = fault_settings(topo, link, faults)
    faults_from_request(settings)  # validate before touching the fabric
    shown = ", ".join(f"{k} {v:g}" for k, v in sorted(faults.items()))
    at = await change_links_at_once(topo, [(a, b)], True, faults)
    if at is not None:
        return (
            f"link {a} <-> {b} (VNI {link.vni}): {shown}, both directions, from t={at * 1e6:.3f} "
            "us emulated (exact run)"
        )
    for end in (a, b):
        msg: dict[str, Any] = {"cmd": "set_faults", "faults": settings}
        if topo.nodes[end].kind is NodeKind.SWITCH:
            msg["port"] = topo.port_of(end, link)
        reply = await control(topo.nodes[end].address, msg)
        if "error" in reply:
            raise RuntimeError(f"{end}: {reply['error']}")
    return f"link {a} <-> {b} (VNI {link.vni}): {shown}, both directions"


def set_faults(topo: Topology, a: str, b: str, faults: dict[str, float]) -> int:
    """``rocev2-emu link A B --loss P ...``: change a running link's faults, both ends."""
    attach(topo)
    print(trio.run(set_link_faults, topo, a, b, faults))
    return 0


def stop_node(topo: Topology, name: str) -> int:
    """``rocev2-emu stop``: end one node of a running fabric (as a crash or docker stop)."""
    if name not in topo.nodes:
        raise TopologyError(f"{topo.path}: no node named {name!r}")
    attach(topo)
    reply = trio.run(control, topo.nodes[name].address, {"cmd": "stop"})
    if not isinstance(reply, dict) or not reply.get("ok"):
        raise RuntimeError(f"node {name}: {reply!r}")
    print(f"node {name} (pid {reply['pid']}) is stopping")
    return 0
