"""One direction of a ring hop: a sender, a receiver, slots and credits.

The receiver owns ``slots`` staging buffers of ``slot_bytes`` each; the sender may fill a slot
only while it holds that slot's credit, so nothing is overwritten before it is consumed (NCCL's
FIFO of steps between a proxy's sender and receiver works the same way).  Item k of a transfer
goes to slot ``k mod slots``; the receiver hands the credit back after it has reduced or copied
the slot.

* :class:`RdmaTx` / :class:`RdmaRx` - across hosts, over the verbs API only: the data is an RDMA
  WRITE with immediate into the receiver's registered slot (the immediate names the operation
  and the item, :func:`collectives.comm.ring.imm_of`), the credit a zero-length SEND with
  immediate back.  A link may stripe its items over several RC QP pairs (NCCL's
  ``NCCL_IB_QPS_PER_CONNECTION``): item k goes on QP k mod q, each QP with its own UDP source
  port, so ECMP sees q flows; each QP delivers in order, so the receiver takes item k from QP
  k mod q's arrivals and the order is whole again.
  The credits are the receiver's clear-to-send grants (receiver-driven admission, as Meta's
  collective library does instead of DCQCN): the sender never has more than ``slots`` chunks
  in flight per link.  With ``grant_dscp`` they travel on a QP of their own at that DSCP (a
  higher priority than the data, so a paused or queued data class does not hold them up).
  Completions arrive on the rank's one CQ and are handed to the right link by
  :class:`Completions`, which the NIC's driver calls as they are made (no poller task); the
  ring operation listening on a link runs once the whole batch is in, and the handler tells
  the driver whether any task woke, so the event engine hands control to trio only then.
* :class:`LocalTx` / :class:`LocalRx` - ranks on the same host (one server's accelerators),
  through its intra-server fabric (:mod:`rocev2_emu.server`: NVLink by default): the data is
  copied into the receiver's slot when written and announced when the fabric delivers it (its
  size over the bandwidth it gets, plus the latency, later); the credit back is a zero-byte
  transfer (the latency).  On a ``free`` fabric both happen at once.

Every chunk passes through here (a completion, a take, a grant, the next write), so this module
is compiled with the protocol cores (mypyc; ``pyproject.toml``'s ``compiled-cores``), which is
why :class:`_Rdma` is a trait: a compiled class has one base class and any number of traits.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Final

import numpy as np
import trio
from mypy_extensions import trait

from collectives.comm import arena
from rocev2_emu.server.fabric import ServerFabric
from rocev2_emu.verbs import (
    CQ,
    MR,
    PD,
    QP,
    Access,
    Doorbell,
    QPInfo,
    RecvWR,
    SendWR,
    Sge,
    WcOpcode,
    WcStatus,
    WrOpcode,
)

IMM_BITS: Final = 32

# The receives a link posts carry no SGEs (a WRITE with immediate lands no bytes in them) and
# are never changed once posted, so every link posts the same ones: receive k of a QP's first
# posts is _RECEIVES[k] (grown to the most slots asked), a repost is _RECEIVES[0].
_RECEIVES: list[RecvWR] = [RecvWR(0)]


def _receives(n: int) -> list[RecvWR]:
    while len(_RECEIVES) < n:
        _RECEIVES.append(RecvWR(len(_RECEIVES)))
    return _RECEIVES[:n]


class LinkError(Exception):
    """A link broke: the peer's QP failed or completions reported an error."""


class _Waitable:
    """What a link end's user waits on: the tasks parked on it, or one ``listener`` called at
    once (a ring operation driven by its links' changes: ``ring.Operation``).  Every change
    says whether it woke a task: the NIC driver's completion handler tells the event engine
    so, which then lets trio run at that instant."""

    def __init__(self) -> None:
        self.changed: trio.lowlevel.ParkingLot | None = None  # made when a task first parks
        self.error: str | None = None
        self.listener: Callable[[], bool] | None = None
        self.batch: Completions | None = None  # the CQ's dispatcher, for RDMA ends

    def notify(self) -> bool:
        """Something changed: tell the listener (after the batch of completions being
        dispatched, if any) and wake the parked tasks (True if a task woke)."""
        woke = False
        if self.listener is not None:
            if self.batch is not None and self.batch.dispatching:
                self.batch.later.append(self.listener)
            else:
                woke = self.listener()
        lot = self.changed
        return (lot is not None and len(lot) > 0 and bool(lot.unpark_all())) or woke

    def fail(self, why: str) -> bool:
        """The link broke; the first reason is the one reported (a retry-exhausted send is
        followed by the flush of everything else, which says nothing about the cause)."""
        if self.error is None:
            self.error = why
        return self.notify()

    async def _park(self) -> None:
        if self.error:
            raise LinkError(self.error)
        if self.changed is None:
            self.changed = trio.lowlevel.ParkingLot()
        await self.changed.park()
        if self.error:
            raise LinkError(self.error)


class _Receiver(_Waitable):
    """The receiving end's slots and the arrivals waiting in them, in write order."""

    def __init__(self, slots: int, slot_bytes: int, lanes: int = 1) -> None:
        super().__init__()
        self.slots = slots
        self.slot_bytes = slot_bytes
        self.memory = arena.zeros(slots * slot_bytes)  # (committed as the slots are written)
        # (immediate, bytes) per lane (QP) in arrival order; item k is on lane k mod lanes; at
        # most ``slots`` in all (each holds a slot), so lists, not deques (760 bytes empty)
        self.arrivals: list[list[tuple[int, int]]] = [[] for _ in range(lanes)]
        self.taken = 0  # arrivals handed out: slots are used in a ring, across operations
        self.received_bytes = 0  # data delivered into the slots, ever (the map's progress)

    def slot(self, index: int, nbytes: int) -> np.ndarray:
        start = index * self.slot_bytes
        return self.memory[start : start + nbytes]

    def deliver(self, imm: int, nbytes: int, lane: int = 0) -> bool:
        self.arrivals[lane].append((imm, nbytes))
        self.received_bytes += nbytes
        return self.notify()

    def take(self) -> tuple[int, int, int] | None:
        """The next (immediate, bytes, slot) in the order they were written, if it arrived."""
        lane = self.arrivals[self.taken % len(self.arrivals)]
        if not lane:
            return None
        imm, nbytes = lane.pop(0)
        self.taken += 1
        return imm, nbytes, (self.taken - 1) % self.slots

    async def arrival(self) -> tuple[int, int, int]:
        """The next (immediate, bytes, slot), waiting for it."""
        while (got := self.take()) is None:
            await self._park()
        return got


class _Sender(_Waitable):
    """The sending end's credits."""

    def __init__(self, slots: int, slot_bytes: int) -> None:
        super().__init__()
        self.slots = slots
        self.slot_bytes = slot_bytes
        self.credits = slots
        self.used = 0
        self.peak_in_flight = 0  # the most chunks written and not yet granted back
        self.outstanding = 0  # writes whose source is still in use (RDMA: not yet completed)

    def credit(self) -> bool:
        self.credits += 1
        return self.notify()

    def take_credit(self) -> int | None:
        """A credit if one is held: the slot the next write goes to (slots are used in a ring,
        across operations, so a credit always frees the oldest slot)."""
        if self.credits == 0:
            return None
        self.credits -= 1
        self.used += 1
        if self.slots - self.credits > self.peak_in_flight:
            self.peak_in_flight = self.slots - self.credits
        return (self.used - 1) % self.slots

    async def acquire(self) -> int:
        """A credit, waiting for one."""
        while (slot := self.take_credit()) is None:
            await self._park()
        return slot


# -- inside a server: shared memory timed by its fabric ------------------------------------


class LocalRx(_Receiver):
    """The receiving end of a link between accelerators ``src`` and ``dst`` of one server
    (their ports on ``fabric``)."""

    def __init__(
        self, slots: int, slot_bytes: int, fabric: ServerFabric, src: int, dst: int
    ) -> None:
        super().__init__(slots, slot_bytes)
        self.tx: LocalTx | None = None
        self.fabric = fabric
        self.src = src
        self.dst = dst

    def release(self, index: int) -> bool:
        """Grant the slot back: a flag to the sender (True if trio must run, see
        :meth:`ServerFabric.send`)."""
        assert self.tx is not None
        return self.fabric.send(self.dst, self.src, 0, self.tx.credit)


class LocalTx(_Sender):
    def __init__(self, rx: LocalRx, copies: bool = True) -> None:
        """``copies=False`` (a timing-only run): the fabric times the bytes, none are copied."""
        super().__init__(rx.slots, rx.slot_bytes)
        self.rx = rx
        self.copies = copies
        rx.tx = self

    def write(self, index: int, data: np.ndarray, mr: MR | None, offset: int, imm: int) -> bool:
        """Copy ``data`` into slot ``index`` (the slot is this sender's until it is announced)
        and announce it when the server's fabric delivers it (the source is free at once).
        True if trio must run (:meth:`ServerFabric.send`)."""
        rx = self.rx
        if self.copies:
            rx.slot(index, data.nbytes)[:] = data
        return rx.fabric.send(rx.src, rx.dst, data.nbytes, partial(rx.deliver, imm, data.nbytes))


# -- RDMA ---------------------------------------------------------------------------------


class Completions:
    """Polls a rank's CQ and hands each completion to the link whose QP it belongs to."""

    def __init__(self, cq: CQ) -> None:
        self.cq = cq
        self.queue = cq.cq  # its completion queue, polled natively (no interpreted call a poll)
        self.by_qpn: dict[int, RdmaTx | RdmaRx] = {}
        self.dispatching = False
        # the listeners of links a dispatch changed: they run once the whole batch is in, as
        # tasks woken by it would (a ring operation sees every arrival and credit of the instant)
        self.later: list[Callable[[], bool]] = []

    def add(self, link: RdmaTx | RdmaRx) -> None:
        """Hand ``link``'s completions to it."""
        link.batch = self
        for qp in link.all_qps:
            self.by_qpn[qp.qp_num] = link

    def attach(self, reads_clock: bool = True) -> None:
        """Dispatch from the NIC's driver as completions are made (:meth:`CQ.set_handler`);
        ``reads_clock``: what the links do with them may read the clock (a write over a
        server's modelled fabric times its transfer)."""
        self.cq.set_handler(self.dispatch, reads_clock=reads_clock)

    def detach(self) -> None:
        self.cq.set_handler(None)

    def dispatch(self) -> bool:
        """Hand every completion on the CQ to its link; True if that woke a task.  An error in
        a link's handling fails every link, so the ranks' waits raise it instead of the
        driver."""
        self.dispatching = True
        try:
            woke = self._take_all(self.by_qpn)
        finally:
            self.dispatching = False
            listeners: list[Callable[[], bool]] = []
            for listener in self.later:  # once each (a link changes many times a batch)
                if listener not in listeners:
                    listeners.append(listener)
            self.later.clear()
        # no longer dispatching: what these listeners change calls its listener at once
        for listener in listeners:
            if listener():
                woke = True
        return woke

    def _take_all(self, by_qpn: dict[int, RdmaTx | RdmaRx]) -> bool:
        woke, queue = False, self.queue
        while True:
            wcs = queue.poll(64)
            if not wcs:
                return woke
            for wc in wcs:
                link = by_qpn.get(wc.qp_num)
                if link is None:
                    continue
                try:
                    if link.on_completion(
                        wc.status, wc.opcode, wc.byte_len, wc.imm_data, wc.qp_num
                    ):
                        woke = True
                except Exception as exc:  # reported to every waiter, not raised in the driver
                    for other in dict.fromkeys(by_qpn.values()):
                        other.fail(f"handling a completion of {link.peer}: {exc!r}")
                    woke = True


@trait
class _Rdma:
    """The RC QPs of a link (mixed into both ends): one, or ``qps`` to stripe over, and the
    grants' own QP when ``grant_dscp`` is set.  A trait (mypyc: a compiled class has one base
    class, and any number of traits after it); its ends bring what it calls of
    :class:`_Waitable` (:meth:`fail`)."""

    slots: int
    qps: list[QP]  # the data QPs
    grant_qp: QP | None  # the credits' own QP (grant_dscp), or None: credits go on qps
    grant_dscp: int | None
    all_qps: list[QP]  # the data QPs, then the grant QP if any (the data QPs' list without)
    doorbells: list[Doorbell]  # all_qps' posting paths (compiled: no interpreted call a post)
    lane_of: dict[int, int]  # QPN -> its index in all_qps; empty for one QP (lane 0)
    peer: str

    def _open_qps(self, pd: PD, cq: CQ, peer: str, qps: int, grant_dscp: int | None = None) -> None:
        self.peer = peer  # "rank N", for errors
        self.qps = [
            QP(pd, cq, max_send_wr=4 * self.slots + 8, max_recv_wr=2 * self.slots + 8)
            for _ in range(qps)
        ]
        self.grant_dscp = grant_dscp
        self.grant_qp = (
            None
            if grant_dscp is None
            else QP(pd, cq, max_send_wr=2 * self.slots + 8, max_recv_wr=2 * self.slots + 8)
        )
        self.all_qps = self.qps if self.grant_qp is None else [*self.qps, self.grant_qp]
        self.doorbells = [qp.doorbell for qp in self.all_qps]
        self.lane_of = (
            {qp.qp_num: k for k, qp in enumerate(self.all_qps)} if len(self.all_qps) > 1 else {}
        )

    def connect(self, peers: list[QPInfo], *, path_mtu: int, timeout: int, retry_cnt: int) -> None:
        """Bring each QP to RTS towards the peer's QP of the same index (the grant QP at its
        DSCP) and post the receives its immediates and grants need."""
        if len(peers) != len(self.all_qps):
            raise LinkError(
                f"link with {self.peer}: the peer has {len(peers)} QPs for it, this rank "
                f"{len(self.all_qps)} (every rank must use the same qps_per_connection and "
                "grant_dscp)"
            )
        for k, (qp, peer) in enumerate(zip(self.all_qps, peers, strict=True)):
            qp.connect(
                peer.remote(),
                path_mtu=path_mtu,
                timeout=timeout,
                retry_cnt=retry_cnt,
                traffic_class=self.grant_dscp if k == len(self.qps) else None,
            )
            qp.post_recv(_receives(2 * self.slots))

    def on_completion(
        self, status: WcStatus, opcode: WcOpcode, nbytes: int, imm: int | None, qpn: int
    ) -> bool:
        """Take one completion; True if that woke a task."""
        if status is not WcStatus.SUCCESS:
            return self.fail(f"link with {self.peer}: {opcode.name} completed with {status.name}")
        if opcode in (WcOpcode.RECV, WcOpcode.RECV_RDMA_WITH_IMM):
            lane = self.lane_of.get(qpn, 0)
            self.doorbells[lane].post_recv(_RECEIVES[0])
            return self.on_receive(nbytes, imm, lane)
        if opcode is WcOpcode.RDMA_WRITE:
            return self.on_written()
        return False

    def on_receive(self, nbytes: int, imm: int | None, lane: int) -> bool:
        raise NotImplementedError

    def on_written(self) -> bool:
        return False

    def fail(self, why: str) -> bool:
        raise NotImplementedError  # _Waitable's, which each end inherits first

    def close(self) -> None:
        for qp in self.all_qps:
            qp.close()


class RdmaRx(_Receiver, _Rdma):
    """The receiving end: registered slots the sender writes into."""

    def __init__(
        self,
        pd: PD,
        cq: CQ,
        slots: int,
        slot_bytes: int,
        peer: str,
        qps: int = 1,
        grant_dscp: int | None = None,
    ) -> None:
        super().__init__(slots, slot_bytes, lanes=qps)
        self._open_qps(pd, cq, peer, qps, grant_dscp)
        self.mr = MR(pd, self.memory, Access.LOCAL_WRITE | Access.REMOTE_WRITE)
        self.released = 0
        self.arrived = 0  # data writes received
        self.peak_held = 0  # the most slots ever full at once (the window: at most slots)

    def on_receive(self, nbytes: int, imm: int | None, lane: int) -> bool:
        if imm is None:
            return self.fail(f"link with {self.peer}: a data write arrived without an immediate")
        self.arrived += 1
        held = self.arrived - self.released  # slots holding data not yet granted back
        if held > self.peak_held:
            self.peak_held = held  # more than ``slots`` would be a sender writing ungranted
        return self.deliver(imm, nbytes, lane)

    def release(self, index: int) -> bool:
        """Grant the sender one more slot (clear to send): on the grant QP, else spread over
        the data QPs as the data is.  The post kicks the NIC; no trio task needs to run."""
        doorbells = self.doorbells
        bell = (
            doorbells[-1] if self.grant_qp is not None else doorbells[self.released % len(self.qps)]
        )
        self.released += 1
        bell.post_send(SendWR(1, WrOpcode.SEND_WITH_IMM, [], imm_data=index))
        return False


class RdmaTx(_Sender, _Rdma):
    """The sending end: holds credits, writes chunks into the receiver's slots."""

    def __init__(
        self,
        pd: PD,
        cq: CQ,
        slots: int,
        slot_bytes: int,
        peer: str,
        qps: int = 1,
        grant_dscp: int | None = None,
    ) -> None:
        super().__init__(slots, slot_bytes)
        self._open_qps(pd, cq, peer, qps, grant_dscp)
        self.remote_addr = 0
        self.rkey = 0
        self.written = 0  # items posted: item k goes on QP k mod len(qps)

    def on_receive(self, nbytes: int, imm: int | None, lane: int) -> bool:
        return self.credit()

    def on_written(self) -> bool:
        self.outstanding -= 1
        return self.notify()

    def write(self, index: int, data: np.ndarray, mr: MR | None, offset: int, imm: int) -> bool:
        """Write ``data`` (``offset`` into ``mr``) into slot ``index`` of the receiver, with
        ``imm``; the post kicks the NIC, no trio task needs to run (False)."""
        assert mr is not None
        self.outstanding += 1
        bell = self.doorbells[self.written % len(self.qps)]
        self.written += 1
        bell.post_send(
            SendWR(
                2,
                WrOpcode.RDMA_WRITE_WITH_IMM,
                [Sge(mr.addr + offset, data.nbytes, mr.lkey)],
                imm_data=imm,
                remote_addr=self.remote_addr + index * self.slot_bytes,
                rkey=self.rkey,
            )
        )
        return False


Tx = LocalTx | RdmaTx
Rx = LocalRx | RdmaRx
