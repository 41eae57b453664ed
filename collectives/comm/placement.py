"""Where a job's ranks are and how they are connected: each rank's place (host, leaf, pod,
server, local rank), the ranks of one server (their server fabric and a barrier), the rings and
their ends, the ring order, the levels of the hierarchical all-reduce, and a communicator's
options.

A server is a host whose ranks share its NIC, or the hosts that name one ``server`` in the
topology (an accelerator and its NIC each); either way its ranks reach each other through its
fabric, and its local ranks number its accelerators.

The ring order is leaf-major (a server's leaf: its first rank's), then server-major, then by
local rank (``order="topology"``), so a ring crosses each spine link as few times as it can and
goes through each server's fabric in one pass, as NCCL's rings do; through servers of a NIC per
accelerator every other server is walked backwards, so that the ring leaves a server and enters
the next at the same accelerator index (the same rail, where the fabric has rails).
``order="rank"`` keeps rank order (the naive ring).

The hierarchy (:func:`hierarchy`) has up to three levels below the top: the ranks of one
server, of one rack (the ranks under one leaf switch: on a rail-optimized fabric, a rail) and
of one pod (the leaves that share their upstream switches, as a fat-tree's pod does).  At
each level a rank's group is the ranks of its server, rack or pod that hold the same position
in every level below, so that they hold the same shard; the top joins the ranks that hold the
same position at every level.  A level whose groups have one member, or whose group is the
whole job, is skipped; one whose groups differ in size cannot be cut into equal shards, and
the hierarchy says why.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import trio

from collectives.comm.links import LocalRx, Rx, Tx
from collectives.comm.tree import TreeNode, double_tree
from rocev2_emu.server.crossbar import PRESETS
from rocev2_emu.server.fabric import ServerFabric


@dataclass(slots=True, frozen=True)
class RankPlace:
    """Where a rank runs: its host (whose NIC it uses), the host's leaf switch, its index in
    its server (the accelerator), the pod and the server ("": the host is its server)."""

    rank: int
    host: str
    leaf: str
    local_rank: int
    pod: str = ""  # the leaves that share their upstream switches ("": one pod)
    server: str = ""  # the server of accelerators it is one of ("": its host alone)

    def __post_init__(self) -> None:
        if not self.server:
            object.__setattr__(self, "server", self.host)


@dataclass(slots=True)
class HostGroup:
    """The ranks of one server (its accelerators, on one host or a host each): the fabric
    between them (shared memory timed by the server's NVLink or PCIe; ``None``: a free one),
    and a barrier."""

    size: int
    fabric: ServerFabric | None = None
    links: dict[tuple[int, int, str], LocalRx] = field(default_factory=dict)
    _arrived: int = 0
    _generation: int = 0
    _lot: trio.lowlevel.ParkingLot = field(default_factory=trio.lowlevel.ParkingLot)

    def local_link(
        self,
        src: int,
        dst: int,
        ring_name: str,
        slots: int,
        slot_bytes: int,
        ports: tuple[int, int],
    ) -> LocalRx:
        """The link from rank ``src`` to rank ``dst`` (accelerators ``ports`` of the server)."""
        key = (src, dst, ring_name)
        if key not in self.links:
            if self.fabric is None:
                self.fabric = ServerFabric(PRESETS["free"], self.size)
            self.links[key] = LocalRx(slots, slot_bytes, self.fabric, *ports)
        return self.links[key]

    async def barrier(self) -> None:
        generation = self._generation
        self._arrived += 1
        if self._arrived == self.size:
            self._arrived = 0
            self._generation += 1
            self._lot.unpark_all()
            return
        while self._generation == generation:
            await self._lot.park()


@dataclass(slots=True)
class Ring:
    name: str
    members: list[int]  # global ranks in ring order
    pos: int
    tx: Tx | None
    rx: Rx | None


def ring_order(places: list[RankPlace], order: str, *, backwards: bool = True) -> list[int]:
    """The ranks in ring order (``order``: "topology" or "rank"); ``backwards=False`` walks
    every server forwards (the hierarchy's positions: accelerator i of every server alike)."""
    if order == "rank":
        return [p.rank for p in places]
    if order != "topology":
        raise ValueError(f"ring order {order!r}: use 'topology' or 'rank'")
    leaves: dict[str, int] = {}
    servers: dict[str, int] = {}
    leaf_of: dict[str, str] = {}  # a server's leaf: its first rank's
    nics: dict[str, set[str]] = {}
    for p in places:  # first appearance fixes the order of leaves and servers
        leaf_of.setdefault(p.server, p.leaf)
        leaves.setdefault(leaf_of[p.server], len(leaves))
        servers.setdefault(p.server, len(servers))
        nics.setdefault(p.server, set()).add(p.host)

    def key(p: RankPlace) -> tuple[int, int, int]:
        k = servers[p.server]
        back = backwards and len(nics[p.server]) > 1 and k % 2 == 1  # leave, enter on one rail
        return (leaves[leaf_of[p.server]], k, -p.local_rank if back else p.local_rank)

    return [p.rank for p in sorted(places, key=key)]


LEVELS = ("server", "rack", "pod")


@dataclass(frozen=True, slots=True)
class Hierarchy:
    """The rings of the hierarchical all-reduce: for each kept level (bottom up) and the top,
    ``rings[level][ring name] = members in ring order``, and each rank's ring per level."""

    levels: list[str]  # kept levels, bottom up, then "top"
    rings: dict[str, dict[str, list[int]]]
    ring_of: dict[str, dict[int, str]]
    refused: str | None = None  # why there is no hierarchy (a level of unequal groups)
    ranks_per_nic: int = 1  # the most ranks sharing one host's NIC
    pos_of: dict[str, dict[int, int]] = field(default_factory=dict)  # a rank's place in its ring

    def rank_rings(self, rank: int) -> list[str]:
        return [self.ring_of[level][rank] for level in self.levels]

    def rank_ring_members(self, rank: int) -> dict[str, tuple[list[int], int]]:
        """Each ring of ``rank`` (bottom up): its members and the rank's position in it."""
        return {
            self.ring_of[level][rank]: (
                self.rings[level][self.ring_of[level][rank]],
                self.pos_of[level][rank],
            )
            for level in self.levels
        }


def hierarchy(places: list[RankPlace]) -> Hierarchy:
    order = ring_order(places, "topology", backwards=False)
    per_nic = max(Counter(p.host for p in places).values(), default=1)
    keys = {
        "server": lambda p: p.server,
        "rack": lambda p: p.leaf,
        "pod": lambda p: p.pod,
    }
    path: dict[int, tuple[int, ...]] = {r: () for r in order}
    levels: list[str] = []
    rings: dict[str, dict[str, list[int]]] = {}
    ring_of: dict[str, dict[int, str]] = {}
    pos_of: dict[str, dict[int, int]] = {}

    def cut(level: str, key: Any) -> dict[Any, list[int]]:
        groups: dict[Any, list[int]] = {}
        for r in order:
            groups.setdefault((key(places[r]), path[r]), []).append(r)
        return groups

    for level in LEVELS:
        if len({keys[level](p) for p in places}) == 1:
            continue  # one host, rack or pod for the whole job: that is the top
        groups = cut(level, keys[level])
        sizes = sorted({len(g) for g in groups.values()})
        if sizes == [1]:
            continue
        if len(sizes) > 1:
            why = f"its {level}s hold different numbers of ranks {sizes}"
            return Hierarchy([], {}, {}, why, per_nic)
        levels.append(level)
        rings[level], ring_of[level], pos_of[level] = {}, {}, {}
        for members in groups.values():
            name = f"{level}:{members[0]}"
            rings[level][name] = members
            for pos, r in enumerate(members):
                ring_of[level][r] = name
                pos_of[level][r] = pos
                path[r] += (pos,)
    if not levels:
        why = "no level below the whole job has more than one rank"
        return Hierarchy([], {}, {}, why, per_nic)
    top = cut("top", lambda p: "")
    rings["top"] = {f"top:{m[0]}": m for m in top.values()}
    ring_of["top"] = {r: f"top:{m[0]}" for m in top.values() for r in m}
    pos_of["top"] = {r: pos for m in top.values() for pos, r in enumerate(m)}
    return Hierarchy([*levels, "top"], rings, ring_of, None, per_nic, pos_of)


@dataclass(frozen=True, slots=True)
class JobPlan:
    """What every rank of a job shares, worked out once per job rather than once per rank: the
    hierarchy, and each ring order with every rank's position in it.  Grows as the ranks times
    the levels (and the orders asked for)."""

    places: list[RankPlace]
    hierarchy: Hierarchy
    _orders: dict[str, tuple[list[int], dict[int, int]]] = field(default_factory=dict)
    # the tree all-reduce's groups (collectives.comm.tree): the ranks holding one shard of
    # their server on every server, in ring order, and each rank's group and position
    _trees: dict[int, tuple[list[int], int]] = field(default_factory=dict)
    _shapes: dict[int, tuple[list[TreeNode], list[TreeNode]]] = field(default_factory=dict)

    def ring(self, order: str) -> tuple[list[int], dict[int, int]]:
        """The flat ring in ``order`` (:func:`ring_order`) and each rank's position in it."""
        got = self._orders.get(order)
        if got is None:
            members = ring_order(self.places, order)
            got = self._orders[order] = (members, {r: i for i, r in enumerate(members)})
        return got

    def tree_group(self, rank: int) -> tuple[list[int], int]:
        """The ranks ``rank`` all-reduces its server's shard with over the two trees (the
        ranks at its position in every server; every rank without servers of several), in
        ring order, and its position among them."""
        if not self._trees:
            h = self.hierarchy
            server = h.pos_of.get("server") if "server" in h.levels else None
            groups: dict[int, list[int]] = {}
            for r in ring_order(self.places, "topology", backwards=False):
                groups.setdefault(0 if server is None else server[r], []).append(r)
            for members in groups.values():
                for pos, r in enumerate(members):
                    self._trees[r] = (members, pos)
        return self._trees[rank]

    def trees(self, m: int) -> tuple[list[TreeNode], list[TreeNode]]:
        """The two trees over ``m`` positions (:func:`~collectives.comm.tree.double_tree`)."""
        if m not in self._shapes:
            self._shapes[m] = double_tree(m)
        return self._shapes[m]

    def tree_links(self, rank: int) -> dict[str, tuple[list[int], int]]:
        """The links ``rank`` needs for the two trees: one to each of its parents and children
        (``tree0:a-b``, ``tree1:a-b``), each a ring of two, and its position in it."""
        members, pos = self.tree_group(rank)
        links: dict[str, tuple[list[int], int]] = {}
        if len(members) < 2:
            return links
        for t, shape in enumerate(self.trees(len(members))):
            node = shape[pos]
            for q in (node.parent, *node.children):
                if q >= 0:
                    pair = sorted((rank, members[q]))
                    links[f"tree{t}:{pair[0]}-{pair[1]}"] = (pair, pair.index(rank))
        return links


_PLAN: list[JobPlan] = []  # the last job's: its ranks ask for it with the same places list


def plan_of(places: list[RankPlace]) -> JobPlan:
    """The plan of the job whose ranks are ``places`` (the list every rank of the job is given:
    the same object, so the plan is made for its first rank and shared by the others)."""
    if _PLAN and _PLAN[0].places is places:
        return _PLAN[0]
    plan = JobPlan(places, hierarchy(places))
    _PLAN[:] = [plan]
    return plan


@dataclass(frozen=True, slots=True)
class CommOptions:
    """How a communicator connects and how long it waits (every rank of a job uses the same)."""

    job: str = "job"  # names the job's keys in the store
    order: str = "topology"  # ring order: "topology" (leaf-major, host-major) or "rank"
    slots: int = 4  # receive slots per link: chunks in flight
    slot_bytes: int = 256 << 10  # bytes per slot (a chunk)
    timeout: float = 0.05  # base deadline of an operation, emulated seconds (more for larger)
    link_gbps: float = 100.0  # the hosts' link rate, for deadlines that scale with size
    server_gbps: float = 0.0  # the server fabric's per-accelerator rate (0: free), for "auto"
    mtu: int = 4096
    qp_timeout: int = 10  # QP local ACK timeout code: 4.096 us * 2^N
    retry_cnt: int = 7
    qps_per_connection: int = 1  # RC QPs a link stripes over (NCCL_IB_QPS_PER_CONNECTION)
    grant_dscp: int | None = None  # the clear-to-send grants' own QP at this DSCP (None: none)
    timing_only: bool = False  # the fabric carries headers only: no arithmetic on what arrives

    @classmethod
    def for_job(
        cls,
        link_gbps: float,
        mtu: int,
        retry_cnt: int,
        params: dict[str, Any],
        server_gbps: float = 0.0,
        timing_only: bool = False,
    ) -> CommOptions:
        """A job's options: the fabric's link rate, MTU, retries and server fabric's rate, and
        the job's parameters
        (``job_id``, ``order``, ``slots``, ``slot_bytes``, ``timeout``, ``qp_timeout``,
        ``qps_per_connection``, ``grant_dscp``)."""
        qps = int(params.get("qps_per_connection", 1))
        if not 1 <= qps <= 64:
            raise ValueError(f"qps_per_connection {qps}: from 1 to 64")
        grant = params.get("grant_dscp")
        if grant is not None and not (isinstance(grant, int) and 0 <= grant < 64):
            raise ValueError(f"grant_dscp {grant!r}: a DSCP, 0 to 63")
        return cls(
            job=str(params.get("job_id", "job")),
            order=str(params.get("order", "topology")),
            slots=int(params.get("slots", 4)),
            slot_bytes=int(params.get("slot_bytes", 256 << 10)),
            timeout=float(params.get("timeout", 0.05)),
            link_gbps=link_gbps,
            server_gbps=server_gbps,
            mtu=mtu,
            qp_timeout=int(params.get("qp_timeout", 10)),
            retry_cnt=retry_cnt,
            qps_per_connection=qps,
            grant_dscp=grant,
            timing_only=timing_only,
        )
