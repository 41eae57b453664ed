"""Changes to a fabric's links at an emulated instant, the same in every mode: what a switch does
when links go down or come back (its ports on them, then its routes converged around every link
down, as a routing protocol would), and the task that makes such a change in a virtual run.

An exact run hands a :class:`~rocev2_emu.runtime.sync.LinkChange` to every process, and each
switch process applies it with :func:`switch_changes`; a virtual run applies the same change to
all its switches at once with :func:`change_links_at`; a job's rank in an exact run asks for
one with :func:`change_links_in_run`.  So a run over processes with a link
failed at instant T is the virtual run with that link failed at T.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from typing import Any

import trio

from rocev2_emu.fabric.nodes import link_faults
from rocev2_emu.runtime.events import Node
from rocev2_emu.runtime.exact import current_engine
from rocev2_emu.runtime.link import LinkFaults, faults_from_request
from rocev2_emu.topology.model import Link, Topology
from switch.pipeline import SwitchCore


def link_indices(topo: Topology, pairs: Iterable[tuple[str, str]]) -> set[int]:
    """The indices of the links between each pair of nodes (a TopologyError names one that is
    no link)."""
    return {topo.link_between(a, b).index for a, b in pairs}


def switch_changes(
    topo: Topology, name: str, core: SwitchCore
) -> Callable[[Iterable[tuple[str, str]], bool, float], None]:
    """What link changes do to switch ``name``: ``apply(pairs, up, now)`` takes its ports on
    those links down or up and converges its routes around every link down so far."""
    down: set[int] = set()
    ports = {link.index: port for port, (link, _) in enumerate(topo.nodes[name].ports)}

    def apply(pairs: Iterable[tuple[str, str]], up: bool, now: float) -> None:
        links = link_indices(topo, pairs)
        (down.difference_update if up else down.update)(links)
        for index in sorted(links):
            if index in ports:
                core.set_link(ports[index], up, now)
        core.set_routes(topo.routes_by_ip(name, frozenset(down)))

    return apply


def fault_settings(topo: Topology, link: Link, faults: dict[str, float]) -> dict[str, Any]:
    """A link's fault settings with ``faults`` over its own (the topology's loss and delay,
    its seed), as a ``set_faults`` request carries them."""
    own = link_faults(topo, link)
    return {"loss": own.loss, "delay": own.delay, "seed": own.seed, **faults}


def changed_faults(
    topo: Topology, pairs: Iterable[tuple[str, str]], faults: dict[str, float], *, exact: bool
) -> list[tuple[tuple[str, str], LinkFaults]]:
    """Each link's faults after a change: its own (the topology's loss, delay and seed) with
    ``faults`` over them, as ``rocev2-emu link`` sets them on the wall clock; checked (a
    ValueError names the field).  ``exact``: a delay below the link's own is refused - the
    run's lookahead was taken from the topology's delays."""
    out = []
    for a, b in pairs:
        link = topo.link_between(a, b)
        own = link_faults(topo, link)
        new = faults_from_request(fault_settings(topo, link, faults))
        if exact and new.delay < own.delay:
            raise ValueError(
                f"link {a} <-> {b}: delay {new.delay * 1e6:g} us is below its own "
                f"{own.delay * 1e6:g} us, which an exact run's lookahead counts on"
            )
        out.append(((a, b), new))
    return out


def set_faults_on(
    topo: Topology, nodes: dict[str, Node], changed: list[tuple[tuple[str, str], LinkFaults]]
) -> None:
    """Give the links ``changed`` their new faults, both directions, at the ends among
    ``nodes`` (an engine's: the sender's wire decides each frame's fate)."""
    for (a, b), faults in changed:
        link = topo.link_between(a, b)
        for end in (a, b):
            node = nodes.get(end)
            wire = node.wires[topo.port_of(end, link)] if node is not None else None
            if wire is not None:
                wire.set_faults(faults)


def change_faults_at(
    topo: Topology, at: float, pairs: list[tuple[str, str]], faults: dict[str, float]
) -> Callable[[dict[str, Any], dict[str, Any]], Awaitable[None]]:
    """A task beside a virtual run: at emulated ``at`` the links between ``pairs`` take
    ``faults`` (over their own, both directions) - what an exact run does with a faults
    change from outside."""
    changed = changed_faults(topo, pairs, faults, exact=False)  # refused now, not mid-run

    async def change(switches: dict[str, Any], agents: dict[str, Any]) -> None:
        nodes = {name: sw.node for name, sw in switches.items()}
        nodes |= {name: agent.ctx.driver.node for name, agent in agents.items()}
        clock = next(iter(switches.values())).clock
        await trio.sleep(max(0.0, at - clock.now()))
        set_faults_on(topo, nodes, changed)

    return change


def change_links_in_run(at: float, pairs: list[tuple[str, str]], *, up: bool) -> bool:
    """In a process of an exact run (a job's rank): ask for the links between ``pairs`` to go
    down (or up) at emulated ``at``, everywhere in the run at once; False outside an exact run
    (nothing asked)."""
    engine = current_engine()
    if engine is None:
        return False
    engine.change_links(at, pairs, up=up)
    return True


def change_links_at(
    topo: Topology, at: float, pairs: list[tuple[str, str]], *, up: bool
) -> Callable[[dict[str, Any], dict[str, Any]], Awaitable[None]]:
    """A task beside a virtual run (``beside(switches, agents)``): at emulated ``at`` the links
    between ``pairs`` go down (or up) on every switch, routes converged everywhere."""
    link_indices(topo, pairs)  # refused now, not mid-run

    async def change(switches: dict[str, Any], agents: dict[str, Any]) -> None:
        applies = [switch_changes(topo, name, sw.core) for name, sw in switches.items()]
        clock = next(iter(switches.values())).clock
        await trio.sleep(max(0.0, at - clock.now()))
        now = clock.now()
        for apply in applies:
            apply(pairs, up, now)

    return change
