"""A rank's session: connecting its rings through the store, deadlines, and aborts.

:class:`RankSession` is the part of a :class:`~collectives.comm.communicator.Communicator` that is
not an operation: it brings up one RC QP pair (or a shared-memory link) per hop of every ring
the rank is in, swapping QPNs, PSNs and rkeys through the rendezvous store; runs each operation
under its deadline (emulated seconds, scaled with its size); and on a failure posts an abort to
the store, so that every other rank raises :class:`CollectiveError` too instead of waiting for
its own deadline (NCCL's async error handling, torch's watchdog).
"""

from __future__ import annotations

import abc
import time
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any, TypeVar

import numpy as np
import trio

from collectives.comm import ring
from collectives.comm.links import Completions, LinkError, LocalTx, RdmaRx, RdmaTx
from collectives.comm.metrics import RankMetrics
from collectives.comm.placement import CommOptions, HostGroup, RankPlace, Ring, plan_of
from collectives.comm.store import Store, StoreTimeout
from rocev2_emu.verbs import CQ, MR, PD, Access, Context, QPInfo

T = TypeVar("T")
R = TypeVar("R", RdmaRx, RdmaTx)

BUS_FACTOR: dict[str, Callable[[int], float]] = {
    # nccl-tests' busBw = algBw x factor (doc/PERFORMANCE.md)
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
    "reduce": lambda n: 1.0,
    "all_to_all": lambda n: (n - 1) / n,
    "send": lambda n: 1.0,
    "recv": lambda n: 1.0,
    "send_recv": lambda n: 1.0,
}


class CollectiveError(Exception):
    """A collective failed on this rank: the message names rank, operation, sequence, peer."""


class RankSession(abc.ABC):
    def __init__(
        self,
        ctx: Context,
        store: Store,
        places: list[RankPlace],
        rank: int,
        group: HostGroup,
        options: CommOptions,
        *,
        metrics: RankMetrics | None = None,
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
        self.options = options
        self.metrics = metrics
        self.pd = PD(ctx)
        self.cq = CQ(ctx, 1 << 16)
        self.completions = Completions(self.cq)
        self.rings: dict[str, Ring] = {}
        self.plan = plan_of(places)  # shared by the job's ranks
        self.hierarchy = self.plan.hierarchy  # the levels of the hierarchical all-reduce
        self.seq = 0
        self.p2p_seq: dict[tuple[str, int], int] = {}  # ("send" | "recv", peer) -> messages
        self.link_seq: dict[tuple[str, str], int] = {}  # ("send" | "recv", link) -> messages
        self._connecting = trio.Lock()
        self.aborted: str | None = None
        self.last: dict[str, Any] = {}
        self._nursery: trio.Nursery | None = None
        self._registered: tuple[np.ndarray, MR] | None = None
        self._store_waits: set[trio.CancelScope] = set()
        # the operation in progress: (bytes a rank receives in it, received before it began)
        self._op: tuple[float, int] | None = None
        if metrics is not None:
            metrics.progress(self._op_received, self._op_expected)

    def _trio_seconds(self, emulated: float) -> float:
        """``emulated`` seconds on trio's clock (wall seconds on the dilated clock)."""
        return self.ctx.clock.wall_duration(emulated)

    def _store_wait(self) -> float:
        """How long a rendezvous or barrier waits for the other ranks: the operation deadline,
        but at least 60 s of wall time (processes start at their own pace)."""
        return max(self._trio_seconds(self.options.timeout), 60.0)

    async def _connect(
        self, rings: dict[str, tuple[list[int], int]], *, barrier: bool = True
    ) -> None:
        """One link per hop of each of this rank's ``rings`` (name: its members and this rank's
        position), through the store; then a barrier of the job (``barrier=False``: of the
        links' peers only, for point-to-point links made while other ranks do something
        else)."""
        pending: list[tuple[Ring, str]] = []
        for name, (members, pos) in rings.items():
            n = len(members)
            ring_ = Ring(name, members, pos, None, None)
            self.rings[name] = ring_
            if n == 1:
                continue
            nxt, prv = members[(pos + 1) % n], members[(pos - 1) % n]
            me = self.place
            if self.places[prv].server == me.server:  # through the server from the predecessor
                ring_.rx = self.group.local_link(
                    prv,
                    self.rank,
                    name,
                    self.options.slots,
                    self.options.slot_bytes,
                    (self.places[prv].local_rank, me.local_rank),
                )
            else:
                rx = self._rdma(RdmaRx, prv)
                ring_.rx = rx
                await self.store.set(
                    f"{self.options.job}/{name}/rx/{self.rank}",
                    [QPInfo.of(qp, rx.mr).row() for qp in rx.all_qps],
                )
                pending.append((ring_, "rx"))
            if self.places[nxt].server == me.server:
                shared = self.group.local_link(
                    self.rank,
                    nxt,
                    name,
                    self.options.slots,
                    self.options.slot_bytes,
                    (me.local_rank, self.places[nxt].local_rank),
                )
                ring_.tx = shared.tx or LocalTx(shared, copies=not self.options.timing_only)
            else:
                tx = self._rdma(RdmaTx, nxt)
                ring_.tx = tx
                await self.store.set(
                    f"{self.options.job}/{name}/tx/{self.rank}",
                    [QPInfo.of(qp).row() for qp in tx.all_qps],
                )
                pending.append((ring_, "tx"))
        wait = self._store_wait()
        for ring_, end in pending:
            n = len(ring_.members)
            if end == "rx":
                prv = ring_.members[(ring_.pos - 1) % n]
                peers = await self._take(f"{self.options.job}/{ring_.name}/tx/{prv}", wait)
                assert isinstance(ring_.rx, RdmaRx)
                self._connect_qps(ring_.rx, [QPInfo(*p) for p in peers])
            else:
                nxt = ring_.members[(ring_.pos + 1) % n]
                peers = await self._take(f"{self.options.job}/{ring_.name}/rx/{nxt}", wait)
                assert isinstance(ring_.tx, RdmaTx)
                infos = [QPInfo(*p) for p in peers]
                self._connect_qps(ring_.tx, infos)
                ring_.tx.remote_addr, ring_.tx.rkey = infos[0].vaddr, infos[0].rkey
        if barrier:
            await self.barrier()
            return
        # no write may reach a QP before it is ready to receive: each end says when it is
        for name in rings:
            await self.store.set(f"{self.options.job}/{name}/ready/{self.rank}", 1)
        for name, (members, _) in rings.items():
            for peer_rank in set(members) - {self.rank}:
                await self._take(f"{self.options.job}/{name}/ready/{peer_rank}", wait)

    @staticmethod
    def pair_name(a: int, b: int) -> str:
        """The two-member ring that links ranks ``a`` and ``b`` both ways (point to point)."""
        return f"pair:{min(a, b)}-{max(a, b)}"

    def check_peer(self, peer: object) -> int:
        if not isinstance(peer, int) or isinstance(peer, bool) or not 0 <= peer < self.size:
            raise ValueError(f"rank {self.rank}: peer {peer!r} is no rank of 0..{self.size - 1}")
        if peer == self.rank:
            raise ValueError(f"rank {self.rank}: a rank cannot send to or receive from itself")
        return peer

    async def _pairs(self, peers: list[int]) -> None:
        """Links with each of ``peers`` (both ways), made on first use as NCCL makes its
        point-to-point connections: each pair waits only for itself, so ranks may connect
        different peers at different times."""
        pairs = {self.pair_name(self.rank, p): sorted((self.rank, p)) for p in peers}
        await self._links({name: (pair, pair.index(self.rank)) for name, pair in pairs.items()})

    async def _links(self, links: dict[str, tuple[list[int], int]]) -> None:
        """The two-member ``links`` (name: members, this rank's position) not made yet."""
        async with self._connecting:  # a send and a recv to one peer at once connect it once
            missing = {name: link for name, link in links.items() if name not in self.rings}
            if missing:
                await self._connect(missing, barrier=False)

    async def _message(
        self,
        name: str,
        send: bool,
        span: tuple[int, int],
        work: np.ndarray,
        op: str,
        progress: list[str],
        reduce: bool = False,
    ) -> None:
        """One message on two-member link ``name``: ``span`` of ``work`` sent, or received
        (reduced into it, or copied), numbered by this direction's count on the link."""
        key = ("send" if send else "recv", name)
        self.link_seq[key] = seq = self.link_seq.get(key, 0) + 1
        rng = span if span[1] > span[0] else None
        step = ring.Step(rng if send else None, None if send else rng, reduce, None)
        await self._ring(name, [step], work, op, progress, seq)

    def _rdma(self, end: type[R], peer: int) -> R:
        """One end of an RDMA link with ``peer``, shaped by the options, its QPs' completions
        routed to it."""
        o = self.options
        link = end(
            self.pd,
            self.cq,
            o.slots,
            o.slot_bytes,
            f"rank {peer}",
            qps=o.qps_per_connection,
            grant_dscp=o.grant_dscp,
        )
        self.completions.add(link)
        return link

    def _connect_qps(self, end: RdmaRx | RdmaTx, peers: list[QPInfo]) -> None:
        end.connect(
            peers,
            path_mtu=self.options.mtu,
            timeout=self.options.qp_timeout,
            retry_cnt=self.options.retry_cnt,
        )

    async def _take(self, key: str, wall_timeout: float) -> Any:
        """A store wait that an abort cuts short, for a key this rank alone reads, once (a
        peer's QPs for its link with this rank, its readiness): the store lets it go, so it
        holds the connections being made, not every one the job made (an all-to-all's grow
        as the square of the ranks)."""
        return await self._store_wait_for(self.store.take, key, wall_timeout)

    async def _arrive(self, key: str, count: int, wall_timeout: float) -> None:
        """A barrier's wait at the store (every rank leaves it at once) that an abort cuts
        short."""
        await self._store_wait_for(partial(self.store.arrive, count=count), key, wall_timeout)

    async def _store_wait_for(
        self, wait: Callable[..., Awaitable[Any]], key: str, wall_timeout: float
    ) -> Any:
        if self.aborted:
            raise CollectiveError(f"rank {self.rank}: job aborted: {self.aborted}")
        with trio.CancelScope() as scope:
            self._store_waits.add(scope)
            try:
                return await wait(key, timeout=wall_timeout)
            except StoreTimeout as exc:
                raise CollectiveError(f"rank {self.rank}: rendezvous failed: {exc}") from exc
            finally:
                self._store_waits.discard(scope)
        raise CollectiveError(f"rank {self.rank}: job aborted: {self.aborted}")

    # -- errors -------------------------------------------------------------------------
    async def _watch_abort(self) -> None:
        while True:
            try:
                why = await self.abort_store.get(
                    f"{self.options.job}/abort", self._trio_seconds(3600.0)
                )
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

    async def _guard(
        self,
        name: str,
        nbytes: int,
        body: Callable[[list[str]], Awaitable[T]],
        seq: int | None = None,
        waiting: Callable[[], str] | None = None,
    ) -> T:
        """Run ``body`` under the operation's deadline; a failure raises CollectiveError and
        aborts the job.  ``seq``: a point-to-point operation's own number (the job's sequence
        counts the collectives, which every rank runs).  A passed deadline names what was
        awaited: ``body``'s progress string, or ``waiting()`` for a body with many peers."""
        if seq is None:
            self.seq += 1
            seq = self.seq
        if self.aborted:
            raise CollectiveError(f"rank {self.rank}: {name} #{seq}: job aborted: {self.aborted}")
        # deadline: the base, plus ten times what the bytes need at the link rate
        deadline = self.options.timeout + 10 * 2 * nbytes * 8 / (self.options.link_gbps * 1e9)
        progress = ["the start"]
        start = self.ctx.now()
        wall0 = time.monotonic()
        self._op = (BUS_FACTOR[name](self.size) * nbytes, self._received())
        try:
            with trio.fail_after(self._trio_seconds(deadline)):
                result = await body(progress)
        except (trio.TooSlowError, LinkError, ring.ProtocolError) as exc:
            what = (
                f"deadline of {deadline * 1e3:.1f} ms (emulated) passed waiting for "
                f"{waiting() if waiting else progress[0]}"
                if isinstance(exc, trio.TooSlowError)
                else str(exc)
            )
            message = f"rank {self.rank}: {name} #{seq} failed: {what}"
            if self.metrics:
                self.metrics.errors.labels(op=name).inc()
            if not self.aborted:
                await self._post_abort(message)
            raise CollectiveError(message) from exc
        finally:
            self._op = None
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

    def _received(self) -> int:
        """Bytes delivered into this rank's receiving links, over all operations."""
        return sum(r.rx.received_bytes for r in self.rings.values() if r.rx is not None)

    def _op_received(self) -> float:
        return float(self._received() - self._op[1]) if self._op else 0.0

    def _op_expected(self) -> float:
        return self._op[0] if self._op else 0.0

    async def _post_abort(self, message: str) -> None:
        self.aborted = message
        with trio.move_on_after(self._trio_seconds(1.0)):
            await self.store.set(f"{self.options.job}/abort", message)

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
        self,
        name: str,
        steps: list[ring.Step],
        work: np.ndarray,
        op: str,
        progress: list[str],
        seq: int | None = None,
    ) -> None:
        operation = self._operation(name, steps, work, op, progress, seq)
        if operation is not None:
            await operation.run()

    def _operation(
        self,
        name: str,
        steps: list[ring.Step],
        work: np.ndarray,
        op: str,
        progress: list[str],
        seq: int | None = None,
    ) -> ring.Operation | None:
        """``steps`` on ring ``name``'s links as an operation to run (None: nothing to do)."""
        r = self.rings[name]
        if not any(s.send or s.recv for s in steps):
            return None
        mr = self._register(work) if isinstance(r.tx, RdmaTx) else None
        n, pos = len(r.members), r.pos
        return ring.Operation(
            steps,
            work,
            mr,
            r.tx,
            r.rx,
            op=op,
            seq=self.seq if seq is None else seq,
            progress=progress,
            pred=f"rank {r.members[(pos - 1) % n]}",
            succ=f"rank {r.members[(pos + 1) % n]}",
            compute=not self.options.timing_only,
        )

    @abc.abstractmethod
    async def barrier(self) -> None:
        """Every rank of the job has reached this point (the last step of connecting)."""
