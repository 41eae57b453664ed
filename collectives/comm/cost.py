"""How ``algo="auto"`` picks an all-reduce's schedule: a bandwidth model with the server's
fabric in it, and the latency rule (docs/collectives.md, "Choosing the schedule").

For a message of S bytes over n ranks, the flat ring moves 2(n-1)/n · S through each host's
NIC.  The hierarchical all-reduce moves, at each level of groups of g (bottom up, then the
top), 2(g-1)/g of the shard its ranks hold entering the level (S, then S/g, ...): through the
server's fabric at the server level, through the NICs above it - where every rank of a server
runs a ring of its own at once, so a NIC that the server's ranks share carries that times
its ranks (a server of a NIC per accelerator: once).  The model's
ratio is the hierarchy's bandwidth time over the ring's (NIC bytes at the link rate plus
fabric bytes at the fabric's rate; a free fabric costs nothing).

The rule, set by the measured runs beside it in the docs: the tree
(:mod:`collectives.comm.tree`) where it has a group of at least ``TREE_GROUP`` ranks and its
messages - half of a server's shard, sent whole - are at most ``TREE_MESSAGE`` bytes: there
2 log2(m) steps beat the rings' steps on every fabric measured (the leaf-spine, a k = 8
fat-tree, AI zones of 64 and 512 ranks; above it the rings' pipelined chunks win); else the
hierarchy where a level exists and the message fits in one slot, or the flat ring's chunk (S /
n) is under ``RING_CHUNK`` (latency rules there: each of the ring's 2(n-1) steps costs a path's
latency and carries a few frames, and the hierarchy's fewer steps win; the crossover measured on
a k = 8 fat-tree is in docs/collectives.md), or where the bandwidth model gives it at most
``THRESHOLD`` of the ring's time
(the per-shard rings of several network levels collide on ECMP and do not overlap as one
ring's steps do: the leaf-spine of 8 servers x 4 measured 11 - 15 % slower than the model
says); else the ring.
"""

from __future__ import annotations

from typing import Final

from collectives.comm.placement import Hierarchy

THRESHOLD: Final = 0.85
TREE_GROUP: Final = 4  # ranks a tree needs before it is worth its depth
TREE_MESSAGE: Final = 32 << 10  # the largest message a tree sends whole, where it wins
RING_CHUNK: Final = 32 << 10  # a flat ring's chunk (S / n) below this: its steps are latency


def tree_message(h: Hierarchy, nbytes: int) -> float:
    """The message the tree sends: half of the shard a rank holds after its server's ring."""
    server = len(next(iter(h.rings["server"].values()))) if "server" in h.levels else 1
    return nbytes / server / 2


def hierarchy_ratio(h: Hierarchy, ranks: int, link_gbps: float, server_gbps: float) -> float:
    """The hierarchical all-reduce's bandwidth time over the flat ring's (``server_gbps`` 0:
    a free server fabric); ``inf`` without a hierarchy."""
    if not h.levels or ranks < 2:
        return float("inf")
    ring = 2 * (ranks - 1) / ranks / link_gbps
    sizes = {level: len(next(iter(h.rings[level].values()))) for level in h.levels}
    per_nic = h.ranks_per_nic  # rings through one NIC at once above the server level
    held, time = 1.0, 0.0  # the fraction of S a rank holds entering each level
    for level in h.levels:
        g = sizes[level]
        moved = 2 * (g - 1) / g * held
        if level == "server":
            time += moved / server_gbps if server_gbps > 0 else 0.0
        else:
            time += moved * per_nic / link_gbps
        held /= g
    return time / ring


def choose(
    h: Hierarchy,
    ranks: int,
    nbytes: int,
    slot_bytes: int,
    link_gbps: float,
    server_gbps: float,
    tree_group: int = 0,
) -> str:
    """``"tree"``, ``"hierarchical"`` or ``"ring"`` for an all-reduce of ``nbytes`` (the rule
    above; ``tree_group``: the ranks of a tree group, 0 for no tree)."""
    if tree_group >= TREE_GROUP and tree_message(h, nbytes) <= TREE_MESSAGE:
        return "tree"
    if not h.levels:
        return "ring"
    if nbytes <= slot_bytes or nbytes / ranks < RING_CHUNK:
        return "hierarchical"
    fast = hierarchy_ratio(h, ranks, link_gbps, server_gbps) <= THRESHOLD
    return "hierarchical" if fast else "ring"
