"""The control requests an exact run's node process answers beside its nodes' own:
``change_links`` (a change from outside the run, taken at the first emulated instant no process
has passed), ``node_stats`` and ``for_nodes`` (a request per process, not per node), and the
per-port commands it refuses - one switch alone would change at no instant the others share.
Each request is checked where it is decoded (:mod:`rocev2_emu.control.requests`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from rocev2_emu.control.requests import Handler, Table
from rocev2_emu.fabric.changes import changed_faults, link_indices
from rocev2_emu.fabric.layout import MAX_PROCESS_NODES, PROCESS_COMMANDS
from rocev2_emu.runtime.exact import ExactEngine
from rocev2_emu.runtime.sync_messages import MAX_CHANGE_LINKS, change_faults
from rocev2_emu.topology.model import Topology, TopologyError


@dataclass(frozen=True, slots=True)
class ChangeLinks:
    """The links between each pair of nodes (``[[a, b], ...]``) down or ``up`` - or, with
    ``faults`` (``{"loss": p, "delay": s, ...}``), taking those faults over their own, both
    directions - at the first emulated instant the run can take it; the reply ``{"at":
    seconds}``."""

    pairs: list[Any]
    up: bool  # said even with faults (true), so that a request that forgets it is refused
    faults: Any = None

    def __post_init__(self) -> None:
        if not 0 < len(self.pairs) <= MAX_CHANGE_LINKS:
            raise ValueError(f"pairs: 1 to {MAX_CHANGE_LINKS} links at once")
        for i, pair in enumerate(self.pairs):
            if not (
                isinstance(pair, list | tuple)
                and len(pair) == 2
                and all(isinstance(n, str) for n in pair)
            ):
                raise ValueError(f"pairs[{i}]: {pair!r:.60} is not [a, b] node names")
        if self.faults is not None:
            change_faults(self.faults)  # a map of LinkFaults' fields, each a number


@dataclass(frozen=True, slots=True)
class ProcessNodes:
    """A request about some nodes of the process asked, by name: 1 to 32 of them at once (a
    request per process, not per node, and its reply well under a control message's 1 MiB)."""

    names: list[Any]

    def __post_init__(self) -> None:
        if not 0 < len(self.names) <= MAX_PROCESS_NODES:
            raise ValueError(f"names: 1 to {MAX_PROCESS_NODES} nodes at once")
        if not all(isinstance(n, str) for n in self.names):
            raise ValueError("names: node names are strings")


@dataclass(frozen=True, slots=True)
class NodeStats(ProcessNodes):
    """The ``stats`` reply of each node of ``names``: ``{"nodes": {name: stats}}`` (a run's
    closing read asks each process, not each node)."""


@dataclass(frozen=True, slots=True)
class ForNodes(ProcessNodes):
    """``request`` to each node of ``names`` in turn, as if sent to its own control port:
    ``{"replies": [reply, ...]}`` in the order of ``names`` (a job tells each process its hosts
    in one request - a connection and a thread's hand-over per process, not per host).  Not a
    command of the process itself (``for_nodes``, ``node_stats``, ``stop``...): only what a
    node answers."""

    request: dict[str, Any]

    def __post_init__(self) -> None:
        ProcessNodes.__post_init__(self)
        cmd = self.request.get("cmd")
        if not isinstance(cmd, str) or cmd in PROCESS_COMMANDS:
            raise ValueError(f"request: a command of a node, not {cmd!r:.40}")


def change_links_handler(topo: Topology, engine: ExactEngine) -> Handler:
    """``change_links``: see :class:`ChangeLinks`."""

    async def change_links(req: ChangeLinks) -> dict[str, Any]:
        pairs = [(str(a), str(b)) for a, b in req.pairs]
        faults = None
        try:
            link_indices(topo, pairs)
            if req.faults is not None:
                changed_faults(topo, pairs, req.faults, exact=True)  # checked before the run
                faults = change_faults(req.faults)
        except TopologyError as exc:
            raise ValueError(str(exc)) from None
        waiter = engine.change_links(None, pairs, up=req.up, faults=faults)
        # no deadline here (it would be an emulated one): the client's, on the wall clock
        await waiter.event.wait()
        return {"at": waiter.at}

    return change_links


REFUSED: Final = ("set_link", "set_faults", "set_routes")


async def _refuse(_: Any) -> dict[str, Any]:
    raise ValueError(
        "an exact run changes its fabric only at emulated instants, everywhere at once: take "
        "links down or up, or change their faults, with change_links (rocev2-emu link, the "
        "map); routes from outside are not taken (use --clock wall)"
    )


def refusals(table: Table) -> Table:
    """The per-port commands of ``table`` (their requests still checked), each answered that an
    exact run changes its fabric only at emulated instants, everywhere at once."""

    return {cmd: (table[cmd][0], _refuse) for cmd in REFUSED if cmd in table}
