"""Where an exact run's nodes live: the layout in words (the groups are
:mod:`rocev2_emu.topology.processes`'), the run's lookahead, and how per-process requests and
flow openings are batched.  Every process computes the same layout from the topology, so
each knows where the others are; it walks the topology a constant number of times.
"""

from __future__ import annotations

import math
from typing import Final

from rocev2_emu.fabric.agent import FlowSpec
from rocev2_emu.fabric.agent_server import MAX_OPEN_FLOWS
from rocev2_emu.topology.model import Topology, TopologyError

MAX_PROCESS_NODES: Final = 32  # nodes per process-level request (a control message <= 1 MiB)
# the commands an exact run's node process answers for itself (on any of its control ports)
PROCESS_COMMANDS: Final = frozenset(
    {"engine", "node_stats", "change_links", "stop", "open_flows", "for_nodes"}
)


def at_addresses(topo: Topology, names: list[str]) -> dict[str, list[str]]:
    """The nodes of ``names`` at each of their addresses, in their order: one at each, or
    several at one (a swarm stack's worker: its nodes' names are its task's aliases)."""
    at: dict[str, list[str]] = {}
    for name in names:
        at.setdefault(topo.nodes[name].address, []).append(name)
    return at


def lookahead(topo: Topology) -> float:
    """The smallest delay of a link between processes (here: every link)."""
    delay = min((link.delay for link in topo.links), default=math.inf)
    if not delay > 0:
        zero = next(lk for lk in topo.links if not lk.delay > 0)
        raise TopologyError(
            f"{topo.path}: link {zero.a} <-> {zero.b} has no delay; an exact run over processes "
            "needs every link between processes to take time (its lookahead): give it delay_us"
        )
    return delay


def process_layout(topo: Topology, workers: int | None) -> str:
    """How an exact run places its nodes, in words (for its header)."""
    if workers is not None:
        return f"{workers} workers"
    if any(len(hosts) > 1 for hosts in topo.servers.values()):
        return "one process per node (a server's hosts in one)"
    return "one process per node"


def by_process(processes: list[str], nodes: set[str]) -> list[list[str]]:
    """The ``nodes`` grouped by the process of ``processes`` (named by :func:`process_name`)
    that hosts them, at most :data:`MAX_PROCESS_NODES` a group, in the processes' order."""
    return [
        group[k : k + MAX_PROCESS_NODES]
        for group in ([n for n in name.split(",") if n in nodes] for name in processes)
        for k in range(0, len(group), MAX_PROCESS_NODES)
    ]


def open_batches(flows: list[FlowSpec], processes: list[str]) -> list[list[FlowSpec]]:
    """``flows`` cut into runs of at most :data:`MAX_OPEN_FLOWS` whose sources share one of
    ``processes`` (named by :func:`process_name`), in their order."""
    home = {node: i for i, name in enumerate(processes) for node in name.split(",")}
    batches: list[list[FlowSpec]] = []
    for flow in flows:
        last = batches[-1] if batches else None
        if last and len(last) < MAX_OPEN_FLOWS and home[last[0].src] == home[flow.src]:
            last.append(flow)
        else:
            batches.append([flow])
    return batches
