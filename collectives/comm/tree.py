"""The tree all-reduce: a double binary tree over the servers, the server's own fabric inside.

NCCL answers a ring's latency (2 (n - 1) steps) with trees for latency-bound sizes: its
double binary tree (Sanders, Speck and Träff, "Two-tree algorithms for full bandwidth
broadcast, reduction and scan", Parallel Computing 2009; NCCL 2.4) reduces one half of the
data up one binary tree and the other half up a second tree whose interior nodes are the
first one's leaves, then broadcasts each half back down its tree: 2 log2(m) steps over m
servers, every server sending and receiving about one message per step.

Here, as NCCL does on a multi-GPU server, the tree joins the servers and the server's fabric
does the rest: the ranks of a server reduce-scatter their data over the server's ring (NVLink
or PCIe), the ranks holding the same shard on every server - one group per accelerator index,
at most ``m`` ranks - all-reduce it over the two trees, and each server all-gathers the
reduced shards back over its ring.  Without servers of several ranks the trees join every
rank.  A message goes up and down whole, not pipelined in chunks as NCCL's tree is: the tree
is for sizes where the ring's step count, not the bandwidth, decides (``algo="auto"``,
:mod:`collectives.comm.cost`).

The trees (:func:`binary_tree`) are in-order: position ``mid`` of a range is the parent of
the middles of its two halves, so every other position is a leaf; the second tree is the
first over positions shifted by one, whose leaves are the first tree's interior nodes.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class TreeNode:
    """One member's place in one tree: its parent and children (positions; -1: the root)."""

    parent: int
    children: tuple[int, ...]


def binary_tree(m: int) -> list[TreeNode]:
    """The in-order binary tree over positions 0 .. m-1 (the root is the middle position):
    each position's parent and children.  Depth ceil(log2(m + 1)); grows as m."""
    parent = [-1] * m
    children: list[list[int]] = [[] for _ in range(m)]
    stack = [(0, m - 1, -1)]  # (lo, hi, the parent of the range's middle)
    while stack:
        lo, hi, up = stack.pop()
        if lo > hi:
            continue
        mid = (lo + hi) // 2
        parent[mid] = up
        if up >= 0:
            children[up].append(mid)
        stack.append((mid + 1, hi, mid))
        stack.append((lo, mid - 1, mid))
    return [TreeNode(parent[p], tuple(sorted(children[p]))) for p in range(m)]


def depth(m: int) -> int:
    """Levels of :func:`binary_tree` over ``m`` positions."""
    return max(1, m.bit_length())


def double_tree(m: int) -> tuple[list[TreeNode], list[TreeNode]]:
    """The two trees over positions 0 .. m-1: the in-order tree, and the same tree over the
    positions shifted by one (position p is the first tree's p + 1), so that a leaf of one is
    an interior node of the other."""
    first = binary_tree(m)
    shift = [
        TreeNode(
            -1 if node.parent < 0 else (node.parent - 1) % m,
            tuple((c - 1) % m for c in node.children),
        )
        for node in first
    ]
    second = [shift[(p + 1) % m] for p in range(m)]
    return first, second
