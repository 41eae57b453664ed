"""Where a job's ranks are: each rank's place (host, leaf, pod, server, local index) from the
topology, worked out once per topology and shared by every rank and host that asks, and the
communicator settings a topology implies.  It holds the last topology's places: one
:class:`~collectives.comm.communicator.RankPlace` per rank, and a list per host.
"""

from __future__ import annotations

from typing import Any

from collectives.comm.communicator import CommOptions, RankPlace
from rocev2_emu.topology.model import NodeKind, Topology

# the last topology's places, and each host's: every rank of a job (and every host of a
# process of an exact run) reads the same list, so the job's plan
# (collectives.comm.placement.plan_of) is worked out once and shared
_PLACES: list[tuple[Topology, list[RankPlace], dict[str, list[RankPlace]]]] = []


def places_for(topo: Topology) -> list[RankPlace]:
    """Every rank's place; a leaf's pod is the set of switches above it (a fat-tree's edge
    switches of one pod share their aggregation switches; a leaf-spine has one pod).  The
    places follow from what a topology is made of (hosts, their ranks, links and servers),
    which nothing changes once it is read: a topology's are worked out once, and every caller
    gets the same list (read it; never change it)."""
    return _placed(topo)[1]


def host_places(topo: Topology, host: str) -> list[RankPlace]:
    """The places of ``host``'s ranks (without a walk of every rank)."""
    return _placed(topo)[2].get(host, [])


def _placed(topo: Topology) -> tuple[Topology, list[RankPlace], dict[str, list[RankPlace]]]:
    if not _PLACES or _PLACES[0][0] is not topo:
        places = _places(topo)
        by_host: dict[str, list[RankPlace]] = {}
        for p in places:
            by_host.setdefault(p.host, []).append(p)
        _PLACES[:] = [(topo, places, by_host)]
    return _PLACES[0]


def _places(topo: Topology) -> list[RankPlace]:
    pods: dict[frozenset[str], str] = {}
    places: list[RankPlace] = []
    accelerators: dict[str, int] = {}  # each server's ranks so far
    for host in topo.hosts:
        _, leaf = topo.host_link(host.name)
        above = frozenset(
            peer
            for _, peer in topo.nodes[leaf.name].ports
            if topo.nodes[peer].kind is NodeKind.SWITCH
        )
        pod = pods.setdefault(above, f"pod{len(pods)}")
        server = topo.server_of(host.name)
        for _ in range(host.ranks):
            local = accelerators.get(server, 0)
            accelerators[server] = local + 1
            places.append(RankPlace(len(places), host.name, leaf.name, local, pod, server))
    return places


def server_ranks(topo: Topology, host: str) -> int:
    """How many ranks ``host``'s server has (the ports of its fabric)."""
    return sum(topo.nodes[h].ranks for h in topo.server_hosts(host))


def comm_options(topo: Topology, params: dict[str, Any]) -> CommOptions:
    """Communicator settings from the topology (link rate, MTU, transport, the server
    fabric) and the job."""
    link, _ = topo.host_link(topo.hosts[0].name)
    return CommOptions.for_job(
        link.rate_bps / 1e9 or 100.0,
        topo.mtu,
        int(topo.transport.get("retry_cnt", 7)),
        params,
        topo.server.bandwidth_bps / 1e9,
        topo.timing_only,
    )
