"""Recordings of virtual runs for the map's replay (``rocev2-emu up --virtual --flows F
--record FILE``, and the virtual scenarios' runs, flows and collective jobs; then
``rocev2-emu view FILE``).

The same samples the live map takes (:class:`~rocev2_emu.ui.sampler.Sampler`), asked of the
in-process switches and NICs instead of their control ports, every :data:`PERIOD` of emulated
time: a virtual run's recording has the resolution of its own microseconds.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any, TextIO

import trio
from prometheus_client import CollectorRegistry

from rocev2_emu.fabric.agent import host_map_state
from rocev2_emu.fabric.nodes import rank_progress
from rocev2_emu.fabric.topology import Topology
from rocev2_emu.ui.sampler import Ask, Sampler, layout
from switch.node import port_states

PERIOD = 10e-6  # emulated seconds between samples


def local_ask(
    topo: Topology,
    switches: dict[str, Any],
    agents: dict[str, Any],
    registry: CollectorRegistry | None = None,
) -> Ask:
    """Answers to ``ports`` and ``map`` from the nodes of this process, by address; with the
    ``registry`` of a virtual job's collectives, each host's ranks' progress too."""
    by_address = {node.address: name for name, node in topo.nodes.items()}
    ranks_of: dict[str, set[int]] = {}
    for h in topo.hosts:  # ranks are numbered host-major in topology order
        first = sum(len(r) for r in ranks_of.values())
        ranks_of[h.name] = set(range(first, first + h.ranks))

    async def ask(address: str, msg: dict[str, Any]) -> Any:
        name = by_address[address]
        if name in switches:
            return port_states(switches[name])
        state = host_map_state(agents[name].ctx)
        if registry is not None:
            state["ranks"] = rank_progress(registry, ranks_of[name])
        return state

    return ask


def recorder(
    topo: Topology,
    path: str,
    period: float = PERIOD,
    registry: CollectorRegistry | None = None,
) -> Callable[[dict[str, Any], dict[str, Any]], Awaitable[None]]:
    """The task that samples a virtual fabric into ``path`` until it is cancelled; with the
    ``registry`` of its collective job, the ranks' progress too."""

    async def record(switches: dict[str, Any], agents: dict[str, Any]) -> None:
        sampler = Sampler(topo, ask=local_ask(topo, switches, agents, registry))
        # a virtual run's file, written as it goes: blocking writes cost no emulated time
        with open(path, "w", encoding="utf-8") as out:  # noqa: ASYNC230
            out.write(json.dumps({"layout": layout(topo)}) + "\n")
            try:
                while True:
                    await _write(sampler, out)
                    await trio.sleep(period)
            finally:  # cancelled when the run ends: its last state too (answered at once)
                with trio.CancelScope(shield=True):
                    await _write(sampler, out)

    return record


async def _write(sampler: Sampler, out: TextIO) -> None:
    sample = await sampler.sample()
    sample["events"] = []
    out.write(json.dumps(sample) + "\n")
