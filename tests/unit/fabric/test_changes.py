"""Changes to a fabric's links at an emulated instant (rocev2_emu/fabric/changes.py) and the
exact node's ``change_links`` request (rocev2_emu/fabric/exact.py): a switch takes its ports on
the links down and converges its routes; bad requests are answered, not applied."""

from __future__ import annotations

import tomllib
from typing import Any

import pytest

from rocev2_emu.control.requests import serve_table
from rocev2_emu.fabric.changes import link_indices, switch_changes
from rocev2_emu.fabric.exact_requests import ChangeLinks, change_links_handler
from rocev2_emu.topology.file import parse
from rocev2_emu.topology.generate import leaf_spine
from rocev2_emu.topology.model import TopologyError
from switch.pipeline import SwitchCore


def _topo() -> Any:
    return parse(tomllib.loads(leaf_spine(2, 2, 2)), "leaf-spine.toml")


def test_a_switch_takes_its_ports_down_and_routes_around_every_link_down_so_far() -> None:
    topo = _topo()
    core = SwitchCore(topo.switch_config("leaf0"))
    apply = switch_changes(topo, "leaf0", core)
    ports = {peer: i for i, (_, peer) in enumerate(topo.nodes["leaf0"].ports)}
    apply([("leaf0", "spine0"), ("leaf1", "spine1")], False, 1e-6)  # one of them is not its own
    assert not core.ports[ports["spine0"]].up and core.ports[ports["spine1"]].up
    assert core.config.routes == topo.routes_by_ip(
        "leaf0", frozenset(link_indices(topo, [("leaf0", "spine0"), ("leaf1", "spine1")]))
    )
    apply([("leaf0", "spine0")], True, 2e-6)  # back up: only leaf1 <-> spine1 still down
    assert core.ports[ports["spine0"]].up
    assert core.config.routes == topo.routes_by_ip(
        "leaf0", frozenset(link_indices(topo, [("leaf1", "spine1")]))
    )
    with pytest.raises(TopologyError, match="no link between 'leaf0' and 'leaf1'"):
        link_indices(topo, [("leaf0", "leaf1")])


@pytest.mark.parametrize(
    ("msg", "match"),
    [
        ({"pairs": [["leaf0", "spine0"]]}, "change_links.up: missing"),
        ({"pairs": [], "up": False}, "change_links: pairs: 1 to 4096 links at once"),
        ({"pairs": ["leaf0"], "up": False}, "pairs[0]: 'leaf0' is not [a, b] node names"),
        ({"pairs": [["leaf0", "leaf1"]], "up": False}, "no link between 'leaf0' and 'leaf1'"),
        ({"pairs": [["leaf0", "spine0"]] * 5000, "up": False}, "pairs: 1 to 4096 links at"),
    ],
)
async def test_a_bad_change_links_request_is_answered_and_nothing_is_asked(
    msg: dict[str, Any], match: str
) -> None:
    handler = change_links_handler(_topo(), None)  # type: ignore[arg-type]  # never reached
    reply = await serve_table(
        {"change_links": (ChangeLinks, handler)}, {"cmd": "change_links", **msg}
    )
    assert match in reply["error"]
