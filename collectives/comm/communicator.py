"""The communicator: what a training script calls (``await comm.all_reduce(grad)``).

A :class:`Communicator` is one rank of a job.  It is built over the verbs API of its host's
NIC (:class:`rocev2_emu.verbs.Context`) and a rendezvous :mod:`store <collectives.comm.store>`;
ranks on the same host (a server's accelerators) share a :class:`HostGroup`: their links go
through the server's fabric (:mod:`rocev2_emu.server`, NVLink by default).

* Rings.  The flat ring orders ranks leaf-major, then host-major, then by local rank
  (``order="topology"``), so a ring crosses each spine link as few times as it can; ``order=
  "rank"`` keeps rank order (the naive ring).  The chosen order is logged.  Hops between ranks
  of one host go through the server's fabric, the others over one RC QP pair each.
* Hierarchical all-reduce by level (the seed's "reduce within a rack first"; Horovod's
  hierarchical allreduce and NCCL's tree of rings do it within a host): a reduce-scatter in
  each host (through the server's fabric), then in each rack (the hosts under one leaf), then in
  each pod (a fat-tree's), each on the shard the level below left; an all-reduce of the last
  shard across the top (one ring per shard, so the spines carry several smaller flows); then
  all-gathers back down.  The levels come from the topology (:func:`~collectives.comm.placement.
  hierarchy`); a level with one member is skipped, one of unequal groups refuses.
* ``algo="auto"``: hierarchical when there is a level below the top and the message fits in
  one slot (fewer steps: faster where latency rules), or when a bandwidth model with the
  server's fabric in it gives the hierarchy well under the ring's time (servers of several
  accelerators: the NICs carry less); else the ring (:mod:`collectives.comm.cost`, measured in
  docs/collectives.md).
* All-to-all (``all_to_all``, and ``all_to_all_v`` with per-peer counts, as MPI's
  ``MPI_Alltoallv`` and torch's ``all_to_all_single`` with splits) and point to point
  (``send``, ``recv``, ``send_recv``): one link each way with every peer, made on first use
  (NCCL connects its point-to-point peers lazily too); all-to-all runs every peer's exchange at
  once, as NCCL's grouped sends and receives.  Messages between two ranks arrive in the order
  they were sent; each direction of a pair counts its own messages, so ranks that do not take
  part are not held up.
* Errors, not hangs: every operation has a deadline (emulated seconds, scaled with its size);
  a failed link, a QP in error or a passed deadline raises :class:`CollectiveError` naming the
  rank, the operation, its sequence number and the peer, and posts an abort to the store so the
  other ranks raise too instead of waiting for their own deadlines (NCCL's async error
  handling, torch's watchdog).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable

import numpy as np
import trio

from collectives.comm import ops, ring
from collectives.comm.links import RdmaRx, RdmaTx
from collectives.comm.metrics import RankMetrics
from collectives.comm.placement import CommOptions, HostGroup, RankPlace, ring_order
from collectives.comm.schedules import AllReduceSchedules
from collectives.comm.session import BUS_FACTOR, CollectiveError
from collectives.comm.store import Store
from rocev2_emu.verbs import Context

log = logging.getLogger("collectives")
ALGORITHMS = ("ring", "hierarchical", "tree", "auto")  # an all-reduce's schedules

__all__ = [
    "BUS_FACTOR",
    "CollectiveError",
    "CommOptions",
    "Communicator",
    "HostGroup",
    "RankPlace",
    "ring_order",
]


def tally(counts: Iterable[int | None]) -> int | None:
    """The sum of counts of wrong values; None if any was not checked (a timing-only run)."""
    total = 0
    for n in counts:
        if n is None:
            return None
        total += n
    return total


class Communicator(AllReduceSchedules):
    """One rank of a job: the collective operations, over its
    :class:`~collectives.comm.session.RankSession` and the all-reduce's schedules."""

    # -- construction ------------------------------------------------------------------
    @classmethod
    async def create(
        cls,
        ctx: Context,
        store: Store,
        places: list[RankPlace],
        rank: int,
        group: HostGroup,
        nursery: trio.Nursery,
        options: CommOptions | None = None,
        *,
        metrics: RankMetrics | None = None,
        abort_store: Store | None = None,
    ) -> Communicator:
        """Connect rank ``rank`` of ``places`` (every rank calls this at once)."""
        options = options or CommOptions()
        comm = cls(
            ctx, store, places, rank, group, options, metrics=metrics, abort_store=abort_store
        )
        order = options.order
        comm._nursery = nursery
        # (over a free or no server fabric nothing a completion starts reads the clock)
        comm.completions.attach(
            reads_clock=group.fabric is not None and group.fabric.model is not None
        )
        members, positions = comm.plan.ring(order)
        if rank == members[0]:
            log.info(
                "ring order (%s): %s", order, " -> ".join(f"{r}@{places[r].host}" for r in members)
            )
        rings = {"flat": (members, positions[rank]), **comm.hierarchy.rank_ring_members(rank)}
        if rank == members[0] and comm.hierarchy.levels:
            log.info("hierarchy: %s", " < ".join(comm.hierarchy.levels))
        try:
            await comm._connect(rings)
        except BaseException:
            comm.close()  # the CQ's handler and any QP made so far
            raise
        nursery.start_soon(comm._watch_abort)
        return comm

    def mismatches(self, got: np.ndarray, want: np.ndarray | float) -> int | None:
        """How many values of ``got`` differ from ``want``; None in a timing-only run (the
        fabric carried no bytes, so there is nothing to check)."""
        if self.options.timing_only:
            return None
        return int(np.count_nonzero(got != want))

    @staticmethod
    def _check(x: np.ndarray, op: str = "sum") -> np.ndarray:
        x = np.asarray(x)
        ops.check(op, x.dtype)
        return x.reshape(-1)

    # -- operations -----------------------------------------------------------------------
    async def all_reduce(
        self, x: np.ndarray, op: str = "sum", out: np.ndarray | None = None, algo: str = "auto"
    ) -> np.ndarray:
        """Reduce ``x`` over all ranks into ``out`` (a new array; ``out=x`` works in place)."""
        flat = self._check(x, op)
        algo = self._choose(flat.nbytes, algo)  # auto: where it is faster (collectives.comm.cost)
        if algo not in ALGORITHMS[:3]:
            raise ValueError(f"algorithm {algo!r}: use {', '.join(ALGORITHMS)}")
        if algo == "hierarchical" and not self.hierarchy.levels:
            raise ValueError(f"no hierarchical all-reduce on this job: {self.hierarchy.refused}")
        if algo == "tree":
            await self._links(self.plan.tree_links(self.rank))  # (made once, on first use)
        # in place, the caller's buffer is the work buffer (one buffer a rank, not two)
        if out is x and (flat is x or flat.base is x):
            work = flat
        else:  # (timing only: no value is read, so none is copied and no page is touched)
            work = np.empty_like(flat) if self.options.timing_only else flat.copy()

        async def body(progress: list[str]) -> None:
            if algo == "ring":
                flat_ring = self.rings["flat"]
                segs = ring.segments(work.size, len(flat_ring.members))
                await self._ring(
                    "flat", ring.all_reduce_steps(segs, flat_ring.pos), work, op, progress
                )
            elif algo == "tree":
                await self._tree(work, op, progress)
            else:
                await self._hierarchical(work, op, progress)
            ops.finish(op, work, self.size)

        await self._guard("all_reduce", flat.nbytes, body)
        return self._deliver(work, x, out)

    async def reduce_scatter(
        self, x: np.ndarray, op: str = "sum", out: np.ndarray | None = None
    ) -> np.ndarray:
        """``x`` holds ``size`` blocks; rank r gets block r reduced over all ranks."""
        flat = self._check(x, op)
        if flat.size % self.size:
            raise ValueError(
                f"reduce_scatter: {flat.size} elements do not split into {self.size} blocks"
            )
        per = flat.size // self.size
        work = flat.copy()
        segs = [(k * per, (k + 1) * per) for k in range(self.size)]
        flat_ring = self.rings["flat"]
        # ring position p must end with the block of the rank at p
        by_pos = [segs[r] for r in flat_ring.members]

        async def body(progress: list[str]) -> None:
            await self._ring(
                "flat", ring.reduce_scatter_steps(by_pos, flat_ring.pos), work, op, progress
            )

        await self._guard("reduce_scatter", flat.nbytes, body)
        block = work[per * self.rank : per * (self.rank + 1)]
        ops.finish(op, block, self.size)
        return self._deliver(block, None, out)

    async def all_gather(self, x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """Every rank's ``x`` (same size), concatenated in rank order."""
        flat = self._check(x)
        per = flat.size
        work = np.empty(per * self.size, flat.dtype)
        work[per * self.rank : per * (self.rank + 1)] = flat
        flat_ring = self.rings["flat"]
        by_pos = [(r * per, (r + 1) * per) for r in flat_ring.members]

        async def body(progress: list[str]) -> None:
            await self._ring(
                "flat", ring.all_gather_steps(by_pos, flat_ring.pos), work, "sum", progress
            )

        await self._guard("all_gather", work.nbytes, body)
        return self._deliver(work, None, out)

    async def broadcast(
        self, x: np.ndarray, root: int = 0, out: np.ndarray | None = None
    ) -> np.ndarray:
        """Rank ``root``'s ``x`` on every rank (a pipelined chain along the ring from root)."""
        flat = self._check(x)
        work = flat.copy()
        flat_ring = self.rings["flat"]
        n = len(flat_ring.members)
        rel = (flat_ring.pos - flat_ring.members.index(root)) % n

        async def body(progress: list[str]) -> None:
            # a chain from the root along the ring: all but the root's predecessor forward
            steps = ring.broadcast_steps(work.size, rel, n)
            await self._ring("flat", steps, work, "sum", progress)

        await self._guard("broadcast", flat.nbytes, body)
        return self._deliver(work, x, out)

    async def reduce(
        self, x: np.ndarray, root: int = 0, op: str = "sum", out: np.ndarray | None = None
    ) -> np.ndarray:
        """The reduction on rank ``root`` (an all-reduce underneath; other ranks get it too)."""
        flat = self._check(x, op)
        work = flat.copy()
        flat_ring = self.rings["flat"]

        async def body(progress: list[str]) -> None:
            segs = ring.segments(work.size, len(flat_ring.members))
            await self._ring("flat", ring.all_reduce_steps(segs, flat_ring.pos), work, op, progress)
            ops.finish(op, work, self.size)

        await self._guard("reduce", flat.nbytes, body)
        return self._deliver(work, x, out)

    async def all_to_all(self, x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """``x`` holds ``size`` equal blocks; block j goes to rank j, and block i of the result
        came from rank i (torch's ``all_to_all_single``, MPI's ``MPI_Alltoall``)."""
        flat = self._check(x)
        if flat.size % self.size:
            raise ValueError(
                f"all_to_all: {flat.size} elements do not split into {self.size} equal blocks"
            )
        counts = [flat.size // self.size] * self.size
        result = await self.all_to_all_v(flat, counts, counts)
        return self._deliver(result, x, out)

    async def all_to_all_v(
        self,
        x: np.ndarray,
        send_counts: list[int],
        recv_counts: list[int],
        out: np.ndarray | None = None,
    ) -> np.ndarray:
        """``x`` cut into ``send_counts[j]`` elements for each rank j, in rank order; the result
        holds ``recv_counts[i]`` elements from each rank i, in rank order.  Both sides must
        agree on every count (a mismatch fails the operation on both)."""
        flat = self._check(x)
        sends, recvs = self._counts("send", send_counts), self._counts("recv", recv_counts)
        if sum(sends) != flat.size:
            raise ValueError(f"all_to_all_v: send counts add up to {sum(sends)}, x has {flat.size}")
        if sends[self.rank] != recvs[self.rank]:
            raise ValueError(
                f"all_to_all_v: rank {self.rank} sends itself {sends[self.rank]} elements and "
                f"expects {recvs[self.rank]}"
            )
        send_at = np.concatenate([[0], np.cumsum(sends)]).astype(int).tolist()
        base = flat.size  # one buffer: the input, then the output (one registration)
        recv_at = (base + np.concatenate([[0], np.cumsum(recvs)])).astype(int).tolist()
        work = np.empty(base + sum(recvs), flat.dtype)
        work[:base] = flat
        me = self.rank
        work[recv_at[me] : recv_at[me + 1]] = flat[send_at[me] : send_at[me + 1]]
        peers = [r for r in range(self.size) if r != me]
        await self._pairs(peers)
        exchanges: list[ring.Operation] = []  # one a peer

        async def body(progress: list[str]) -> None:  # (under the operation's number)
            for peer in peers:
                send = (send_at[peer], send_at[peer + 1]) if sends[peer] else None
                recv = (recv_at[peer], recv_at[peer + 1]) if recvs[peer] else None
                steps = [ring.Step(send, recv, False, None)]
                name = self.pair_name(me, peer)
                operation = self._operation(name, steps, work, "sum", ["the start"])
                if operation is not None:
                    exchanges.append(operation)
            await ring.run_all(exchanges)  # one waiting task for them all

        def waiting() -> str:
            pending = [o.progress[0] for o in exchanges if not o.over]
            more = f" and {len(pending) - 3} more peers" if len(pending) > 3 else ""
            return "; ".join(pending[:3]) + more

        await self._guard("all_to_all", flat.nbytes, body, waiting=waiting)
        return self._deliver(work[base:], None, out)

    def _counts(self, which: str, counts: list[int]) -> list[int]:
        if len(counts) != self.size or not all(
            isinstance(c, int | np.integer) and not isinstance(c, bool) and c >= 0 for c in counts
        ):
            raise ValueError(
                f"all_to_all_v: {which} counts {counts!r:.80} are not {self.size} counts >= 0"
            )
        return [int(c) for c in counts]

    async def send(self, x: np.ndarray, peer: int) -> None:
        """``x`` to rank ``peer``, which must ``recv`` as many elements of the same type."""
        flat = self._check(x)
        await self._p2p("send", flat, [("send", self.check_peer(peer), (0, flat.size))])

    async def recv(self, out: np.ndarray, peer: int) -> np.ndarray:
        """Rank ``peer``'s next message into ``out`` (its size and type are the message's)."""
        work = self._check(out).copy()
        await self._p2p("recv", work, [("recv", self.check_peer(peer), (0, work.size))])
        return self._deliver(work, out, out)

    async def send_recv(self, x: np.ndarray, to: int, out: np.ndarray, frm: int) -> np.ndarray:
        """``send(x, to)`` and ``recv(out, frm)`` at once, as one operation (nccl-tests'
        sendrecv; a pipeline stage passing activations on while it takes the next ones)."""
        flat, into = self._check(x), self._check(out)
        if flat.dtype != into.dtype:
            raise ValueError(f"send_recv: x is {flat.dtype}, out is {into.dtype}")
        to, frm = self.check_peer(to), self.check_peer(frm)
        work = np.empty(flat.size + into.size, flat.dtype)
        work[: flat.size] = flat
        both = [("send", to, (0, flat.size)), ("recv", frm, (flat.size, work.size))]
        await self._p2p("send_recv", work, both)
        return self._deliver(work[flat.size :], out, out)

    async def _p2p(
        self, name: str, work: np.ndarray, parts: list[tuple[str, int, tuple[int, int]]]
    ) -> None:
        """Point-to-point ``parts`` (send or recv, peer, element range of ``work``) as one
        operation: each numbered by its direction's own count of messages."""
        await self._pairs(sorted({peer for _, peer, _ in parts}))
        runs = []
        for kind, peer, (lo, hi) in parts:
            key = (kind, peer)
            self.p2p_seq[key] = self.p2p_seq.get(key, 0) + 1
            rng = (lo, hi) if hi > lo else None
            step = ring.Step(
                rng if kind == "send" else None, rng if kind == "recv" else None, False, None
            )
            runs.append((self.pair_name(self.rank, peer), [step], self.p2p_seq[key]))

        async def body(progress: list[str]) -> None:
            try:
                async with trio.open_nursery() as nursery:
                    for ring_name, steps, seq in runs:
                        nursery.start_soon(self._ring, ring_name, steps, work, "sum", progress, seq)
            except BaseExceptionGroup as group:
                raise ring.first_error(group) from None

        # the bytes sent (nccl-tests' size for sendrecv), or received when only receiving
        moved = [hi - lo for kind, _, (lo, hi) in parts if kind == "send"] or [
            hi - lo for _, _, (lo, hi) in parts
        ]
        await self._guard(name, sum(moved) * work.itemsize, body, seq=runs[0][2])

    async def barrier(self) -> None:
        """Every rank has reached this call (through the store, like NCCL's bootstrap)."""
        self.seq += 1
        key = f"{self.options.job}/barrier/{self.seq}"
        await self._arrive(key, self.size, self._store_wait())

    @staticmethod
    def _deliver(work: np.ndarray, like: np.ndarray | None, out: np.ndarray | None) -> np.ndarray:
        shaped = work.reshape(like.shape) if like is not None else work
        if out is None:
            return shaped
        np.copyto(out, shaped.reshape(out.shape))
        return out

    def close(self) -> None:
        self.completions.detach()
        for r in self.rings.values():
            for end in (r.tx, r.rx):
                if isinstance(end, RdmaRx | RdmaTx):
                    end.close()


def gbps(nbytes: int, seconds: float) -> float:
    return nbytes / seconds / 1e9 if seconds > 0 else math.inf
