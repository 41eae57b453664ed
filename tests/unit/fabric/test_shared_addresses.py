"""Nodes that share an address (a swarm stack's worker, its nodes' names the aliases of its
task): found once, asked by name through their process's ``for_nodes``, their metrics served
together."""

from __future__ import annotations

import tomllib
from typing import Any

import pytest
import trio
from prometheus_client import CollectorRegistry, Gauge

from rocev2_emu.fabric import exact
from rocev2_emu.fabric.layout import at_addresses
from rocev2_emu.runtime.metrics import merged
from rocev2_emu.topology.file import parse
from rocev2_emu.topology.generate import single_switch
from rocev2_emu.topology.model import Topology


def _worker_topology() -> Topology:
    """A switch and four hosts, the switch and h0-h1 at one address, h2 and h3 at their own."""
    topo = parse(tomllib.loads(single_switch(4)), "t.toml")
    for name in ("sw0", "h0", "h1"):
        topo.nodes[name].address = "10.9.0.1"
    topo._shared = None  # as topology.file.resolve_names does after changing addresses
    return topo


def test_a_shared_address_is_found_once_and_groups_its_nodes() -> None:
    topo = _worker_topology()
    assert [topo.shares_address(n) for n in topo.nodes] == [True, True, True, False, False]
    at = at_addresses(topo, list(topo.nodes))
    assert at["10.9.0.1"] == ["sw0", "h0", "h1"] and len(at) == 3


@pytest.mark.parametrize(
    ("name", "cmd", "wrapped"),
    [("h1", "digests", True), ("h1", "open_flows", False), ("h2", "digests", False)],
)
def test_a_node_sharing_its_address_is_asked_by_name_through_its_process(
    monkeypatch: pytest.MonkeyPatch, name: str, cmd: str, wrapped: bool
) -> None:
    """A node's own command to a node at a shared address goes as ``for_nodes`` naming it, and
    its reply is unwrapped; a command of the process itself, or a node at an address of its
    own, goes as it is."""
    topo = _worker_topology()
    sent: list[tuple[str, dict[str, Any]]] = []

    async def control(address: str, msg: dict[str, Any], timeout: float = 0.0) -> Any:
        sent.append((address, msg))
        if msg["cmd"] == "for_nodes":
            return {"replies": [{"node": msg["names"][0]}]}
        return {"node": "asked directly"}

    monkeypatch.setattr(exact, "control", control)
    reply = trio.run(exact.ask_node, topo, name, {"cmd": cmd})
    ((address, msg),) = sent
    assert address == topo.nodes[name].address
    if wrapped:
        assert msg == {"cmd": "for_nodes", "names": [name], "request": {"cmd": cmd}}
        assert reply == {"node": name}
    else:
        assert msg == {"cmd": cmd} and reply == {"node": "asked directly"}


def test_the_metrics_of_nodes_at_one_address_are_served_together() -> None:
    registries = []
    for node in ("h0", "h1"):
        registry = CollectorRegistry()
        Gauge("rocev2_test_value", "a value", ["node"], registry=registry).labels(node).set(1)
        registries.append(registry)
    assert merged(registries[:1]) is registries[0]
    samples = [s for m in merged(registries).collect() for s in m.samples]
    assert sorted(s.labels["node"] for s in samples) == ["h0", "h1"]
