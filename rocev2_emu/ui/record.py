"""Recordings of virtual runs for the map's replay (``rocev2-emu up --virtual --flows F
--record FILE``, then ``rocev2-emu view FILE``).

The same samples the live map takes (:class:`~rocev2_emu.ui.sampler.Sampler`), asked of the
in-process switches and NICs instead of their control ports, every :data:`PERIOD` of emulated
time: a virtual run's recording has the resolution of its own microseconds.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from rocev2_emu.fabric.agent import host_map_state
from rocev2_emu.fabric.topology import Topology
from rocev2_emu.ui.sampler import Ask, Sampler, layout
from switch.node import port_states

PERIOD = 10e-6  # emulated seconds between samples


def local_ask(topo: Topology, switches: dict[str, Any], agents: dict[str, Any]) -> Ask:
    """Answers to ``ports`` and ``map`` from the nodes of this process, by address."""
    by_address = {node.address: name for name, node in topo.nodes.items()}

    async def ask(address: str, msg: dict[str, Any]) -> Any:
        name = by_address[address]
        if name in switches:
            return port_states(switches[name])
        return host_map_state(agents[name].ctx)

    return ask


def recorder(
    topo: Topology, path: str, period: float = PERIOD
) -> Callable[[dict[str, Any], dict[str, Any]], Awaitable[None]]:
    """The task that samples a virtual fabric into ``path`` until it is cancelled."""

    async def record(switches: dict[str, Any], agents: dict[str, Any]) -> None:
        sampler = Sampler(topo, ask=local_ask(topo, switches, agents))
        # a virtual run's file, written as it goes: blocking writes cost no emulated time
        with open(path, "w", encoding="utf-8") as out:  # noqa: ASYNC230
            out.write(json.dumps({"layout": layout(topo)}) + "\n")
            while True:
                sample = await sampler.sample()
                sample["events"] = []
                out.write(json.dumps(sample) + "\n")
                await trio.sleep(period)

    return record
