"""Control requests as types: decoding names the field at fault, a table answers every bad
request with an error and goes on, and docs/architecture.md lists the tables as they are."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

import collectives.plugin  # noqa: F401  (its modules register the jobs)
from collectives.jobs.job import CollectiveRequest
from rocev2_emu.control.requests import (
    NoFields,
    RequestError,
    Table,
    decode,
    describe,
    serve_table,
)
from rocev2_emu.fabric.agent_server import AgentServer, OpenFlows
from rocev2_emu.fabric.exact_requests import ChangeLinks, ForNodes, NodeStats
from switch.node import SetRoutes, control_table

ROOT = Path(__file__).resolve().parents[3]


@dataclass(frozen=True, slots=True)
class Move:
    port: int
    up: bool
    rate: float = 1.0
    names: list[str] | None = None

    def __post_init__(self) -> None:
        if self.port < 0:
            raise ValueError(f"port {self.port}: not a port")


@pytest.mark.parametrize(
    ("msg", "error"),
    [
        ({"up": True}, "move.port: missing"),
        ({"port": "1", "up": True}, "move.port: '1' is not int"),
        ({"port": True, "up": True}, "move.port: True is not int"),  # a bool is not a number
        ({"port": 1, "up": 1}, "move.up: 1 is not bool"),
        ({"port": 1, "up": True, "rate": "fast"}, "move.rate: 'fast' is not float"),
        ({"port": 1, "up": True, "speed": 3}, "move: unknown field(s) speed"),
        ({"port": -1, "up": True}, "move: port -1: not a port"),  # the class's own check
    ],
)
def test_decoding_names_the_field_at_fault(msg: dict[str, Any], error: str) -> None:
    with pytest.raises(RequestError) as info:
        decode(Move, "move", {"cmd": "move", **msg})
    assert str(info.value) == error


def test_decoding_takes_defaults_and_ints_for_floats() -> None:
    got = decode(Move, "move", {"cmd": "move", "port": 2, "up": False, "rate": 3})
    assert got == Move(2, False, 3.0) and isinstance(got.rate, float)
    named = decode(Move, "move", {"cmd": "move", "port": 2, "up": False, "names": ["a"]})
    assert named.names == ["a"]
    assert (
        decode(Move, "move", {"cmd": "move", "port": 2, "up": False, "names": None}).names is None
    )
    with pytest.raises(RequestError, match=r"move.names: 'a' is not list"):
        decode(Move, "move", {"cmd": "move", "port": 2, "up": False, "names": "a"})


async def test_a_table_answers_errors_and_its_handlers_values() -> None:
    async def move(req: Move) -> dict[str, Any]:
        if req.rate > 10:
            raise ValueError("rate: too fast")
        return {"moved": req.port}

    table: Table = {"move": (Move, move)}
    assert await serve_table(table, {"cmd": "move", "port": 3, "up": True}) == {"moved": 3}
    assert await serve_table(table, {"cmd": "move", "port": 3, "up": True, "rate": 11}) == {
        "error": "move: rate: too fast"
    }
    bad: Any
    for bad in (None, [], {"cmd": 5}, {"cmd": "fly"}, {}):
        reply = await serve_table(table, bad)
        assert reply["error"].startswith("unknown command") and "known: move" in reply["error"]


def test_set_routes_checks_every_entry() -> None:
    SetRoutes([[167772161, [0, 1]], (167772162, (2,))])
    with pytest.raises(ValueError, match=r"routes\[1\]: .* is not \[host ip, \[port, ...\]\]"):
        SetRoutes([[1, [0]], [2, ["x"]]])


def test_the_architecture_doc_lists_every_command_as_the_tables_have_it() -> None:
    class Driver:
        core = SimpleNamespace(ports=())

    doc = (ROOT / "docs" / "architecture.md").read_text()
    switch = describe(control_table(Driver()))  # type: ignore[arg-type]
    agent = describe(AgentServer.__new__(AgentServer).table)
    assert "```\n" + "\n".join(switch) + "\n```" in doc
    assert "```\n" + "\n".join(agent) + "\n```" in doc


def test_the_architecture_doc_lists_the_rows_nodes_and_plugins_add() -> None:
    doc = (ROOT / "docs" / "architecture.md").read_text()
    added: Table = {
        "stop": (NoFields, _never),
        "map": (NoFields, _never),
        "engine": (NoFields, _never),
        "change_links": (ChangeLinks, _never),
        "node_stats": (NodeStats, _never),
        "open_flows": (OpenFlows, _never),
        "for_nodes": (ForNodes, _never),
        "collective": (CollectiveRequest, _never),
    }
    assert "```\n" + "\n".join(describe(added)) + "\n```" in doc


async def _never(_: Any) -> dict[str, Any]:
    raise AssertionError("not called")


def test_typed_rows_of_nodes_and_plugins_refuse_what_is_not_their_shape() -> None:
    with pytest.raises(RequestError, match=r"change_links\.up: 'yes' is not bool"):
        decode(ChangeLinks, "change_links", {"pairs": [["a", "b"]], "up": "yes"})
    with pytest.raises(RequestError, match=r"pairs\[1\]: \['b'\] is not \[a, b\] node names"):
        decode(ChangeLinks, "change_links", {"pairs": [["a", "b"], ["b"]], "up": True})
    with pytest.raises(RequestError, match=r"pairs: 1 to \d+ links at once"):
        decode(ChangeLinks, "change_links", {"pairs": [], "up": True})
    with pytest.raises(RequestError, match=r"node_stats\.names: 'h0' is not list"):
        decode(NodeStats, "node_stats", {"names": "h0"})
    with pytest.raises(RequestError, match=r"names: node names are strings"):
        decode(NodeStats, "node_stats", {"names": ["h0", 7]})
    with pytest.raises(RequestError, match=r"names: 1 to 32 nodes at once"):
        decode(NodeStats, "node_stats", {"names": [f"h{i}" for i in range(33)]})
    with pytest.raises(RequestError, match=r"for_nodes\.request: missing"):
        decode(ForNodes, "for_nodes", {"names": ["h0"]})
    with pytest.raises(RequestError, match=r"names: node names are strings"):
        decode(ForNodes, "for_nodes", {"names": [3], "request": {"cmd": "stats"}})
    for inner in ({"cmd": "for_nodes", "names": ["h0"], "request": {}}, {"cmd": "stop"}, {}):
        with pytest.raises(RequestError, match=r"request: a command of a node, not"):
            decode(ForNodes, "for_nodes", {"names": ["h0"], "request": inner})
    asked = decode(ForNodes, "for_nodes", {"names": ["h0", "h1"], "request": {"cmd": "stats"}})
    assert asked.request == {"cmd": "stats"}
    with pytest.raises(RequestError, match=r"flows: 1 to 256 at once"):
        decode(OpenFlows, "open_flows", {"flows": []})
    with pytest.raises(RequestError, match=r"flows\[1\]: .* is not \{spec, dst\}"):
        decode(OpenFlows, "open_flows", {"flows": [{"spec": {}, "dst": "a"}, {"spec": {}}]})
    one_link = {"pairs": [["a", "b"]], "up": True}
    with pytest.raises(RequestError, match=r"link fault loss=True must be a number"):
        decode(ChangeLinks, "change_links", {**one_link, "faults": {"loss": True}})
    with pytest.raises(RequestError, match=r"link fault loss=2(\.0)? is not a probability"):
        decode(ChangeLinks, "change_links", {**one_link, "faults": {"loss": 2}})
    with pytest.raises(RequestError, match=r"link faults must be a map, not list"):
        decode(ChangeLinks, "change_links", {**one_link, "faults": [0.1]})
    with pytest.raises(RequestError, match=r"store: \['h', '1'\] is not \[address, port\]"):
        decode(CollectiveRequest, "collective", {"name": "bench", "store": ["h", "1"]})
    with pytest.raises(RequestError, match=r"unknown collective job 'nope'"):
        decode(CollectiveRequest, "collective", {"name": "nope", "store": "exact"})
    assert decode(CollectiveRequest, "collective", {"results": True}).results
