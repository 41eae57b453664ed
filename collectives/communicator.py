"""The communicator: what a training script calls (``await comm.all_reduce(grad)``).

A :class:`Communicator` is one rank of a job.  It is built over the verbs API of its host's
NIC (:class:`rocev2_emu.verbs.Context`) and a rendezvous :mod:`store <collectives.store>`;
ranks on the same host share a :class:`HostGroup` (shared memory, the seed's NVLink).

* Rings.  The flat ring orders ranks leaf-major, then host-major, then by local rank
  (``order="topology"``), so a ring crosses each spine link as few times as it can; ``order=
  "rank"`` keeps rank order (the naive ring).  The chosen order is logged.  Hops between ranks
  of one host go through shared memory, the others over one RC QP pair each.
* Hierarchical all-reduce (as Horovod's hierarchical allreduce and NCCL's tree of rings): a
  reduce-scatter inside each host through shared memory, then one ring per local rank across
  hosts on that rank's shard, then an all-gather inside each host.  Needs the same number of
  ranks on every host.
* ``algo="auto"``: hierarchical when hosts hold more than one rank and the message is at least
  one slot per rank, else the ring.
* Errors, not hangs: every operation has a deadline (emulated seconds, scaled with its size);
  a failed link, a QP in error or a passed deadline raises :class:`CollectiveError` naming the
  rank, the operation, its sequence number and the peer, and posts an abort to the store so the
  other ranks raise too instead of waiting for their own deadlines (NCCL's async error
  handling, torch's watchdog).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from typing import Any, TypeVar

import numpy as np
import trio

from collectives import ops, ring
from collectives.links import (
    Completions,
    LinkError,
    LocalRx,
    LocalTx,
    RdmaRx,
    RdmaTx,
    Rx,
    Tx,
)
from collectives.metrics import RankMetrics
from collectives.store import Store, StoreTimeout
from rocev2_emu.verbs import CQ, MR, PD, Access, Context, QPInfo

log = logging.getLogger("collectives")
T = TypeVar("T")

BUS_FACTOR: dict[str, Callable[[int], float]] = {
    # nccl-tests' busBw = algBw x factor (doc/PERFORMANCE.md)
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
    "reduce": lambda n: 1.0,
}


class CollectiveError(Exception):
    """A collective failed on this rank: the message names rank, operation, sequence, peer."""


@dataclass(slots=True, frozen=True)
class RankPlace:
    """Where a rank runs: its host, the host's leaf switch, its index on the host."""

    rank: int
    host: str
    leaf: str
    local_rank: int


@dataclass(slots=True)
class HostGroup:
    """The ranks of one host: shared memory between them, and a barrier."""

    size: int
    buffers: dict[int, np.ndarray] = field(default_factory=dict)  # local rank -> its shard
    links: dict[tuple[int, int, str], LocalRx] = field(default_factory=dict)
    _arrived: int = 0
    _generation: int = 0
    _lot: trio.lowlevel.ParkingLot = field(default_factory=trio.lowlevel.ParkingLot)

    def local_link(
        self, src: int, dst: int, ring_name: str, slots: int, slot_bytes: int
    ) -> LocalRx:
        key = (src, dst, ring_name)
        if key not in self.links:
            self.links[key] = LocalRx(slots, slot_bytes)
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
class _Ring:
    name: str
    members: list[int]  # global ranks in ring order
    pos: int
    tx: Tx | None
    rx: Rx | None


def ring_order(places: list[RankPlace], order: str) -> list[int]:
    if order == "rank":
        return [p.rank for p in places]
    if order != "topology":
        raise ValueError(f"ring order {order!r}: use 'topology' or 'rank'")
    leaves: dict[str, int] = {}
    hosts: dict[str, int] = {}
    for p in places:  # first appearance fixes the order of leaves and hosts
        leaves.setdefault(p.leaf, len(leaves))
        hosts.setdefault(p.host, len(hosts))
    return [
        p.rank for p in sorted(places, key=lambda p: (leaves[p.leaf], hosts[p.host], p.local_rank))
    ]


class Communicator:
    def __init__(
        self,
        ctx: Context,
        store: Store,
        places: list[RankPlace],
        rank: int,
        group: HostGroup,
        *,
        job: str,
        slots: int,
        slot_bytes: int,
        timeout: float,
        link_gbps: float,
        mtu: int,
        qp_timeout: int,
        retry_cnt: int,
        metrics: RankMetrics | None,
        abort_store: Store | None = None,
    ) -> None:
        self.ctx = ctx
        self.store = store
        self.abort_store = abort_store or store  # a blocking watch needs its own connection
        self.places = places
        self.rank = rank
        self.size = len(places)
        self.place = places[rank]
        self.group = group
        self.job = job
        self.slots = slots
        self.slot_bytes = slot_bytes
        self.timeout = timeout
        self.link_gbps = link_gbps
        self.mtu = mtu
        self.qp_timeout = qp_timeout
        self.retry_cnt = retry_cnt
        self.metrics = metrics
        self.pd = PD(ctx)
        self.cq = CQ(ctx, 1 << 16)
        self.completions = Completions(self.cq)
        self.rings: dict[str, _Ring] = {}
        self.local_ring: str | None = None  # this rank's ring across hosts (hierarchical)
        self.seq = 0
        self.aborted: str | None = None
        self.last: dict[str, Any] = {}
        self._nursery: trio.Nursery | None = None
        self._registered: tuple[np.ndarray, MR] | None = None
        self._store_waits: set[trio.CancelScope] = set()

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
        *,
        job: str = "job",
        order: str = "topology",
        slots: int = 4,
        slot_bytes: int = 256 << 10,
        timeout: float = 0.05,
        link_gbps: float = 100.0,
        mtu: int = 4096,
        qp_timeout: int = 10,
        retry_cnt: int = 7,
        metrics: RankMetrics | None = None,
        abort_store: Store | None = None,
    ) -> Communicator:
        """Connect rank ``rank`` of ``places`` (every rank calls this at once); ``timeout`` is
        the base deadline of an operation in emulated seconds (more for larger messages)."""
        comm = cls(
            ctx,
            store,
            places,
            rank,
            group,
            job=job,
            slots=slots,
            slot_bytes=slot_bytes,
            timeout=timeout,
            link_gbps=link_gbps,
            mtu=mtu,
            qp_timeout=qp_timeout,
            retry_cnt=retry_cnt,
            metrics=metrics,
            abort_store=abort_store,
        )
        comm._nursery = nursery
        nursery.start_soon(comm.completions.run, 1.0)
        members = ring_order(places, order)
        if rank == members[0]:
            log.info(
                "ring order (%s): %s", order, " -> ".join(f"{r}@{places[r].host}" for r in members)
            )
        rings = {"flat": members}
        local_sizes = {sum(1 for p in places if p.host == h.host) for h in places}
        if len(local_sizes) == 1 and local_sizes != {1}:
            for j in range(next(iter(local_sizes))):
                rings[f"local{j}"] = [r for r in members if places[r].local_rank == j]
        if f"local{comm.place.local_rank}" in rings:
            comm.local_ring = f"local{comm.place.local_rank}"
        await comm._connect(rings)
        nursery.start_soon(comm._watch_abort)
        return comm

    def _wall(self, emulated: float) -> float:
        return self.ctx.clock.wall_duration(emulated)

    def _store_wait(self) -> float:
        """How long a rendezvous or barrier waits for the other ranks: the operation deadline,
        but at least 60 s of wall time (processes start at their own pace)."""
        return max(self._wall(self.timeout), 60.0)

    async def _connect(self, rings: dict[str, list[int]]) -> None:
        pending: list[tuple[_Ring, str]] = []
        for name, members in rings.items():
            if self.rank not in members:
                continue
            pos = members.index(self.rank)
            n = len(members)
            ring_ = _Ring(name, members, pos, None, None)
            self.rings[name] = ring_
            if n == 1:
                continue
            nxt, prv = members[(pos + 1) % n], members[(pos - 1) % n]
            me = self.place
            if self.places[prv].host == me.host:  # shared memory from the predecessor
                ring_.rx = self.group.local_link(prv, self.rank, name, self.slots, self.slot_bytes)
            else:
                rx = RdmaRx(self.pd, self.cq, self.slots, self.slot_bytes, f"rank {prv}")
                self.completions.by_qpn[rx.qp.qp_num] = rx
                ring_.rx = rx
                await self.store.set(
                    f"{self.job}/{name}/rx/{self.rank}", asdict(QPInfo.of(rx.qp, rx.mr))
                )
                pending.append((ring_, "rx"))
            if self.places[nxt].host == me.host:
                shared = self.group.local_link(self.rank, nxt, name, self.slots, self.slot_bytes)
                ring_.tx = shared.tx or LocalTx(shared)
            else:
                tx = RdmaTx(self.pd, self.cq, self.slots, self.slot_bytes, f"rank {nxt}")
                self.completions.by_qpn[tx.qp.qp_num] = tx
                ring_.tx = tx
                await self.store.set(f"{self.job}/{name}/tx/{self.rank}", asdict(QPInfo.of(tx.qp)))
                pending.append((ring_, "tx"))
        wait = self._store_wait()
        for ring_, end in pending:
            n = len(ring_.members)
            if end == "rx":
                prv = ring_.members[(ring_.pos - 1) % n]
                peer = QPInfo(**await self._get(f"{self.job}/{ring_.name}/tx/{prv}", wait))
                assert isinstance(ring_.rx, RdmaRx)
                self._connect_qp(ring_.rx, peer)
            else:
                nxt = ring_.members[(ring_.pos + 1) % n]
                peer = QPInfo(**await self._get(f"{self.job}/{ring_.name}/rx/{nxt}", wait))
                assert isinstance(ring_.tx, RdmaTx)
                self._connect_qp(ring_.tx, peer)
                ring_.tx.remote_addr, ring_.tx.rkey = peer.vaddr, peer.rkey
        await self.barrier()

    def _connect_qp(self, end: RdmaRx | RdmaTx, peer: QPInfo) -> None:
        end.connect(peer, path_mtu=self.mtu, timeout=self.qp_timeout, retry_cnt=self.retry_cnt)

    async def _get(self, key: str, wall_timeout: float) -> Any:
        """A store wait that an abort cuts short."""
        if self.aborted:
            raise CollectiveError(f"rank {self.rank}: job aborted: {self.aborted}")
        with trio.CancelScope() as scope:
            self._store_waits.add(scope)
            try:
                return await self.store.get(key, wall_timeout)
            except StoreTimeout as exc:
                raise CollectiveError(f"rank {self.rank}: rendezvous failed: {exc}") from exc
            finally:
                self._store_waits.discard(scope)
        raise CollectiveError(f"rank {self.rank}: job aborted: {self.aborted}")

    # -- errors -------------------------------------------------------------------------
    async def _watch_abort(self) -> None:
        while True:
            try:
                why = await self.abort_store.get(f"{self.job}/abort", self._wall(3600.0))
            except StoreTimeout:
                continue
            self.aborted = str(why)
            for scope in list(self._store_waits):
                scope.cancel()
            for r in self.rings.values():
                for end in (r.tx, r.rx):
                    if end is not None:
                        end.fail(f"aborted: {why}")
            return

    async def _guard(self, name: str, nbytes: int, body: Callable[[list[str]], Awaitable[T]]) -> T:
        self.seq += 1
        seq = self.seq
        if self.aborted:
            raise CollectiveError(f"rank {self.rank}: {name} #{seq}: job aborted: {self.aborted}")
        # deadline: the base, plus ten times what the bytes need at the link rate
        deadline = self.timeout + 10 * 2 * nbytes * 8 / (self.link_gbps * 1e9)
        progress = ["the start"]
        start = self.ctx.now()
        wall0 = time.monotonic()
        try:
            with trio.fail_after(self._wall(deadline)):
                result = await body(progress)
        except (trio.TooSlowError, LinkError, ring.ProtocolError) as exc:
            what = (
                f"deadline of {deadline * 1e3:.1f} ms (emulated) passed waiting for {progress[0]}"
                if isinstance(exc, trio.TooSlowError)
                else str(exc)
            )
            message = f"rank {self.rank}: {name} #{seq} failed: {what}"
            if self.metrics:
                self.metrics.errors.labels(op=name).inc()
            if not self.aborted:
                await self._post_abort(message)
            raise CollectiveError(message) from exc
        elapsed = self.ctx.now() - start
        self.last = {
            "op": name,
            "seq": seq,
            "seconds": elapsed,
            "bytes": nbytes,
            "wall": time.monotonic() - wall0,
        }
        if self.metrics:
            self.metrics.observe(name, nbytes, elapsed, BUS_FACTOR[name](self.size))
        return result

    async def _post_abort(self, message: str) -> None:
        self.aborted = message
        with trio.move_on_after(self._wall(1.0)):
            await self.store.set(f"{self.job}/abort", message)

    # -- helpers --------------------------------------------------------------------------
    def _register(self, work: np.ndarray) -> MR:
        """Register ``work`` for RDMA sends (the last buffer is kept registered)."""
        if self._registered is not None and self._registered[0] is work:
            return self._registered[1]
        if self._registered is not None:
            self._registered[1].close()
        raw = work.view(np.uint8) if work.size else np.zeros(1, np.uint8)
        mr = MR(self.pd, raw, Access.LOCAL_WRITE)
        self._registered = (work, mr)
        return mr

    async def _ring(
        self, name: str, steps: list[ring.Step], work: np.ndarray, op: str, progress: list[str]
    ) -> None:
        r = self.rings[name]
        if not any(s.send or s.recv for s in steps):
            return
        mr = self._register(work) if isinstance(r.tx, RdmaTx) else None
        n, pos = len(r.members), r.pos
        await ring.run(
            steps,
            work,
            mr,
            r.tx,
            r.rx,
            op=op,
            seq=self.seq,
            progress=progress,
            pred=f"rank {r.members[(pos - 1) % n]}",
            succ=f"rank {r.members[(pos + 1) % n]}",
        )

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
        if algo == "auto":
            hier = self.local_ring is not None and flat.nbytes >= self.slot_bytes * self.size
            algo = "hierarchical" if hier else "ring"
        if algo not in ("ring", "hierarchical"):
            raise ValueError(f"algorithm {algo!r}: use ring, hierarchical or auto")
        if algo == "hierarchical" and self.local_ring is None:
            raise ValueError(
                "hierarchical all-reduce needs the same number (> 1) of ranks per host"
            )
        work = flat.copy()

        async def body(progress: list[str]) -> None:
            if algo == "ring":
                flat_ring = self.rings["flat"]
                segs = ring.segments(work.size, len(flat_ring.members))
                await self._ring(
                    "flat", ring.all_reduce_steps(segs, flat_ring.pos), work, op, progress
                )
            else:
                await self._hierarchical(work, op, progress)
            ops.finish(op, work, self.size)

        await self._guard("all_reduce", flat.nbytes, body)
        return self._deliver(work, x, out)

    async def _hierarchical(self, work: np.ndarray, op: str, progress: list[str]) -> None:
        g, j = self.group, self.place.local_rank
        shards = ring.segments(work.size, g.size)
        lo, hi = shards[j]
        g.buffers[j] = work  # publish my input to the host's shared memory
        progress[0] = "the host's other ranks (intra-host reduce-scatter)"
        await g.barrier()
        shard = g.buffers[0][lo:hi].copy() if j != 0 else work[lo:hi].copy()
        for k in range(1, g.size):
            ops.combine(op, shard, g.buffers[k][lo:hi])
        await g.barrier()  # everyone has read the inputs
        assert self.local_ring is not None
        inter = self.rings[self.local_ring]
        segs = ring.segments(shard.size, len(inter.members))
        await self._ring(inter.name, ring.all_reduce_steps(segs, inter.pos), shard, op, progress)
        g.buffers[j] = shard
        progress[0] = "the host's other ranks (intra-host all-gather)"
        await g.barrier()
        for k, (a, b) in enumerate(shards):
            work[a:b] = g.buffers[k]
        await g.barrier()  # everyone has copied before buffers change

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

    async def barrier(self) -> None:
        """Every rank has reached this call (through the store, like NCCL's bootstrap)."""
        self.seq += 1
        key = f"{self.job}/barrier/{self.seq}"
        if await self.store.add(key, 1) == self.size:
            await self.store.set(f"{key}/done", 1)
        await self._get(f"{key}/done", self._store_wait())

    @staticmethod
    def _deliver(work: np.ndarray, like: np.ndarray | None, out: np.ndarray | None) -> np.ndarray:
        shaped = work.reshape(like.shape) if like is not None else work
        if out is None:
            return shaped
        np.copyto(out, shaped.reshape(out.shape))
        return out

    def close(self) -> None:
        for r in self.rings.values():
            for end in (r.tx, r.rx):
                if isinstance(end, RdmaRx | RdmaTx):
                    end.close()


def gbps(nbytes: int, seconds: float) -> float:
    return nbytes / seconds / 1e9 if seconds > 0 else math.inf
