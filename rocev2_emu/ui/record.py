"""Recordings of virtual runs for the map's replay (``rocev2-emu up --virtual --flows F
--record FILE``, and the virtual scenarios' runs, flows and collective jobs; then
``rocev2-emu view FILE``).

The same samples the live map takes (:class:`~rocev2_emu.ui.sampler.Sampler`), read from the
in-process switches and NICs instead of their control ports, every :data:`PERIOD` of emulated
time and once more when the run ends: a virtual run's recording has the resolution of its own
microseconds.  A sample holds every node (about 0.8 KB each), so above :data:`FULL_RATE_NODES`
nodes the period grows with the fabric (:func:`period_for`): a k = 16 fat-tree's 1 344 nodes
at 10 us made 561 MB for a 5.5 ms incast, more than a browser replays.  The recorder is an
observer of the event engine (:meth:`~rocev2_emu.runtime.engine.Engine.watch`), not a trio
task: it reads between events and never wakes trio, so a recorded run computes exactly what an
unrecorded one does.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, TextIO

from prometheus_client import CollectorRegistry

from rocev2_emu.fabric.agent import host_map_state
from rocev2_emu.fabric.nodes import rank_progress, server_fabric_state
from rocev2_emu.fabric.virtual import Watcher
from rocev2_emu.topology.model import Topology
from rocev2_emu.ui.sampler import Sampler, layout
from switch.node import port_states

PERIOD = 10e-6  # emulated seconds between samples, for fabrics of up to FULL_RATE_NODES
FULL_RATE_NODES = 64


def period_for(topo: Topology) -> float:
    """The sampling period of ``topo``'s recordings: :data:`PERIOD`, stretched in proportion
    to the nodes beyond :data:`FULL_RATE_NODES` (a recording's bytes per emulated second stay
    about those of a 64-node fabric's)."""
    return PERIOD * max(1.0, len(topo.nodes) / FULL_RATE_NODES)


def local_read(
    topo: Topology,
    switches: dict[str, Any],
    agents: dict[str, Any],
    registry: CollectorRegistry | None = None,
) -> Callable[[float], tuple[dict[str, Any], dict[str, Any]]]:
    """What every node would answer to ``ports`` and ``map`` at emulated time ``t``, read from
    the nodes of this process; with the ``registry`` of a virtual job's collectives, each
    host's ranks' progress and the servers' fabrics too (with the first host's answer)."""
    # the host of each rank (ranks are numbered host-major in topology order): one entry a
    # rank, so a sample sorts the ranks' rows to their hosts in one pass over the ranks
    host_of = [h.name for h in topo.hosts for _ in range(h.ranks)]
    progress = registry is not None and bool(host_of)
    # a server fabric counts only where it runs a model; elsewhere its read would walk the
    # whole registry for nothing
    fabrics = any(
        topo.server.modelled(sum(topo.nodes[h].ranks for h in hosts))
        for hosts in topo.servers.values()
    )

    def read(t: float) -> tuple[dict[str, Any], dict[str, Any]]:
        ranks_at: dict[str, dict[str, Any]] = {}
        if progress and registry is not None:
            for r, row in rank_progress(registry).items():
                rank = int(r)
                if 0 <= rank < len(host_of):
                    ranks_at.setdefault(host_of[rank], {})[r] = row
        hosts = {}
        for name, agent in agents.items():
            hosts[name] = host_map_state(agent.ctx, t)
            if registry is not None and len(hosts) == 1:
                hosts[name]["server_fabric"] = server_fabric_state(registry) if fabrics else {}
            if progress:
                hosts[name]["ranks"] = ranks_at.get(name, {})
        return {name: port_states(sw, t) for name, sw in switches.items()}, hosts

    return read


def recorder(
    topo: Topology,
    path: str,
    period: float | None = None,
    registry: CollectorRegistry | None = None,
) -> Watcher:
    """A watcher of a virtual fabric that records it into ``path``: every ``period`` of
    emulated time (default :func:`period_for` the fabric), and when the run ends; with the
    ``registry`` of its collective job, the ranks' progress too."""
    every = period_for(topo) if period is None else period

    def start(switches: dict[str, Any], agents: dict[str, Any]) -> Callable[[], None]:
        sampler = Sampler(topo)
        read = local_read(topo, switches, agents, registry)
        engine = next(iter(switches.values())).engine
        # a virtual run's file, written as it goes: blocking writes cost no emulated time
        out = open(path, "w", encoding="utf-8")  # noqa: SIM115 - closed by finish()
        out.write(json.dumps({"layout": layout(topo)}) + "\n")

        def observe(t: float) -> None:
            _write(out, sampler.compose(*read(t)))

        def finish() -> None:
            engine.watch(every, None)
            try:
                _write(out, sampler.compose(*read(engine.now)))
            finally:
                out.close()

        engine.watch(every, observe)
        return finish

    return start


def _write(out: TextIO, sample: dict[str, Any]) -> None:
    sample["events"] = []
    out.write(json.dumps(sample) + "\n")
