"""The nodes of one event engine, built once for virtual time and for an exact run.

:func:`build_nodes` makes the cores of the named nodes on ``engine`` and wires their links:
every switch in the topology's order, then every host, then every link.  The order is the
contract: it fixes the seeded QPNs and PSNs and the order tasks are created in, so a process of
an exact run (:func:`~rocev2_emu.fabric.exact_node.joined_nodes`) builds its share exactly as
the virtual fabric (:func:`~rocev2_emu.fabric.virtual.virtual_fabric`) builds the whole.
A link with both ends here is wired on the engine's heap; one with an end in another process
is handed to ``remote``.  Grows with the nodes named: nothing here walks the whole fabric
but its links, once.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass, field

from rocev2_emu.fabric.agent import HostAgent
from rocev2_emu.fabric.nodes import host_agent, host_config, link_faults
from rocev2_emu.nic.driver import EngineNic
from rocev2_emu.runtime.clock import DilatedClock
from rocev2_emu.runtime.engine import Engine
from rocev2_emu.runtime.events import Node
from rocev2_emu.runtime.link import LinkFaults
from rocev2_emu.topology.model import Link, NodeKind, Topology
from rocev2_emu.verbs.api import Context
from rocev2_emu.wire.ethernet import LINK_UDP_PORT
from switch.driver import EngineSwitch
from switch.pipeline import SwitchCore

# A link's end here (its node on the engine, its port) toward a node elsewhere (by name), with
# the link's faults
Remote = Callable[[Link, Node, int, str, LinkFaults | None], None]


@dataclass(slots=True)
class EngineNodes:
    """What :func:`build_nodes` made, by node name, in the topology's order."""

    switches: dict[str, EngineSwitch] = field(default_factory=dict)
    agents: dict[str, HostAgent] = field(default_factory=dict)
    nodes: dict[str, Node] = field(default_factory=dict)  # every node's, on the engine


async def build_nodes(
    topo: Topology,
    names: set[str] | None,
    engine: Engine,
    contexts: AsyncExitStack,
    *,
    remote: Remote | None = None,
    on_switch: Callable[[str, EngineSwitch], None] | None = None,
    on_host: Callable[[str, HostAgent], Awaitable[None]] | None = None,
) -> EngineNodes:
    """The nodes ``names`` (None: all) of ``topo`` on ``engine``: each switch's core and each
    host's NIC (its :class:`Context` kept open by ``contexts``) and agent, seeded from the
    topology; ``on_switch`` and ``on_host`` are called as each is made (a process of an exact
    run serves its control ports there).  Then each link: on the heap when both ends are
    here, else ``remote(link, node, port, peer, faults)`` for the end that is."""
    built = EngineNodes()
    mine = [n for n in topo.nodes.values() if names is None or n.name in names]
    for node in mine:
        if node.kind is NodeKind.SWITCH:
            core = SwitchCore(topo.switch_config(node.name))
            switch = EngineSwitch(core, engine, DilatedClock(1.0), (node.address, LINK_UDP_PORT))
            built.switches[node.name] = switch
            built.nodes[node.name] = switch.node
            if on_switch is not None:
                on_switch(node.name, switch)
    for node in mine:
        if node.kind is NodeKind.HOST:
            cfg = host_config(topo, node.name, 1.0, None, seeded=True)
            ctx = await contexts.enter_async_context(Context.open(cfg, engine=engine))
            assert isinstance(ctx.driver, EngineNic)
            built.nodes[node.name] = ctx.driver.node
            agent = built.agents[node.name] = host_agent(topo, ctx, node.name)
            if on_host is not None:
                await on_host(node.name, agent)
    here = built.nodes
    for link in topo.links:
        faults = link_faults(topo, link)
        (a, a_port), (b, b_port) = ((end, topo.port_of(end, link)) for end in (link.a, link.b))
        if a in here and b in here:
            engine.connect(here[a], a_port, here[b], b_port, (faults, faults))
            continue
        for end, port, peer in ((a, a_port, b), (b, b_port, a)):
            if end in here:
                if remote is None:
                    raise ValueError(f"link {link.a}-{link.b}: {peer} is not a node here")
                remote(link, here[end], port, peer, faults)
    return built
