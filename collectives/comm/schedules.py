"""The all-reduce's schedules over a rank's links: hierarchical (rings level by level) and
tree (NCCL's double binary tree over servers, the server's ring inside them), and the choice
among them and the flat ring by the cost model (``algo="auto"``, :mod:`collectives.comm.cost`).

What each keeps per rank is its rings' and trees' links (made once per job, the trees' on
first use) and no copy of the data: every step works in the caller's work buffer.
"""

from __future__ import annotations

import numpy as np
import trio

from collectives.comm import cost, ring
from collectives.comm.session import RankSession
from collectives.comm.tree import TreeNode


class AllReduceSchedules(RankSession):
    """The schedules an all-reduce runs on (:class:`~collectives.comm.communicator.
    Communicator` runs them under its guard and deadline)."""

    async def _hierarchical(self, work: np.ndarray, op: str, progress: list[str]) -> None:
        """Reduce-scatter up the levels (each level's group cuts the shard it shares into one
        piece per member), all-reduce the last piece across the top, all-gather back down."""
        names = self.hierarchy.rank_rings(self.rank)
        spans = [(0, work.size)]  # the range this rank's group shares, level by level
        cuts: list[list[tuple[int, int]]] = []
        for name in names[:-1]:
            r = self.rings[name]
            lo, hi = spans[-1]
            segs = [(lo + a, lo + b) for a, b in ring.segments(hi - lo, len(r.members))]
            await self._ring(name, ring.reduce_scatter_steps(segs, r.pos), work, op, progress)
            cuts.append(segs)
            spans.append(segs[r.pos])
        top = self.rings[names[-1]]
        lo, hi = spans[-1]
        segs = [(lo + a, lo + b) for a, b in ring.segments(hi - lo, len(top.members))]
        await self._ring(top.name, ring.all_reduce_steps(segs, top.pos), work, op, progress)
        for name, segs in zip(reversed(names[:-1]), reversed(cuts), strict=True):
            r = self.rings[name]
            await self._ring(name, ring.all_gather_steps(segs, r.pos), work, "sum", progress)

    async def connect_for(self, nbytes: int, algo: str = "auto") -> None:
        """Make the links an all-reduce of ``nbytes`` with ``algo`` uses that are made on
        first use (the trees'), so that a timed operation does not pay for them."""
        if self._choose(nbytes, algo) == "tree":
            await self._links(self.plan.tree_links(self.rank))

    def _choose(self, nbytes: int, algo: str) -> str:
        if algo != "auto":
            return algo
        o = self.options
        group = len(self.plan.tree_group(self.rank)[0])
        return cost.choose(
            self.hierarchy, self.size, nbytes, o.slot_bytes, o.link_gbps, o.server_gbps, group
        )

    async def _tree(self, work: np.ndarray, op: str, progress: list[str]) -> None:
        """Reduce-scatter over the server's ring, all-reduce this rank's shard over the two
        trees of its group (one half each), all-gather over the server's ring
        (:mod:`collectives.comm.tree`)."""
        h = self.hierarchy
        server = h.ring_of["server"][self.rank] if "server" in h.levels else None
        lo, hi = 0, work.size
        if server is not None:
            r = self.rings[server]
            segs = ring.segments(work.size, len(r.members))
            await self._ring(server, ring.reduce_scatter_steps(segs, r.pos), work, op, progress)
            lo, hi = segs[r.pos]
        members, pos = self.plan.tree_group(self.rank)
        if len(members) > 1:
            mid = (lo + hi) // 2
            shapes = self.plan.trees(len(members))
            try:
                async with trio.open_nursery() as nursery:
                    for t, span in enumerate(((lo, mid), (mid, hi))):
                        node = shapes[t][pos]
                        nursery.start_soon(
                            self._one_tree, t, node, members, span, work, op, progress
                        )
            except BaseExceptionGroup as group:
                raise ring.first_error(group) from None
        if server is not None:
            await self._ring(server, ring.all_gather_steps(segs, r.pos), work, "sum", progress)

    async def _one_tree(
        self,
        t: int,
        node: TreeNode,
        members: list[int],
        span: tuple[int, int],
        work: np.ndarray,
        op: str,
        progress: list[str],
    ) -> None:
        """``span`` reduced up tree ``t`` from the children, sent to the parent; the result
        from the parent, sent down to the children."""

        def link(q: int) -> str:
            a, b = sorted((self.rank, members[q]))
            return f"tree{t}:{a}-{b}"

        async with trio.open_nursery() as nursery:
            for c in node.children:
                nursery.start_soon(self._message, link(c), False, span, work, op, progress, True)
        if node.parent >= 0:
            await self._message(link(node.parent), True, span, work, op, progress)
            await self._message(link(node.parent), False, span, work, op, progress)
        async with trio.open_nursery() as nursery:
            for c in node.children:
                nursery.start_soon(self._message, link(c), True, span, work, op, progress)
