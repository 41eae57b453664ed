"""One direction of a ring hop: a sender, a receiver, slots and credits.

The receiver owns ``slots`` staging buffers of ``slot_bytes`` each; the sender may fill a slot
only while it holds that slot's credit, so nothing is overwritten before it is consumed (NCCL's
FIFO of steps between a proxy's sender and receiver works the same way).  Item k of a transfer
goes to slot ``k mod slots``; the receiver hands the credit back after it has reduced or copied
the slot.

* :class:`RdmaTx` / :class:`RdmaRx` - across hosts, over the verbs API only: the data is an RDMA
  WRITE with immediate into the receiver's registered slot (the immediate names the operation,
  step and chunk), the credit a zero-length SEND with immediate back.  A link may stripe its
  items over several RC QP pairs (NCCL's ``NCCL_IB_QPS_PER_CONNECTION``): item k goes on QP
  k mod q, each QP with its own UDP source port, so ECMP sees q flows; each QP delivers in
  order, so the receiver takes item k from QP k mod q's arrivals and the order is whole again.
  The credits are the receiver's clear-to-send grants (receiver-driven admission, as Meta's
  collective library does instead of DCQCN): the sender never has more than ``slots`` chunks
  in flight per link.  With ``grant_dscp`` they travel on a QP of their own at that DSCP (a
  higher priority than the data, so a paused or queued data class does not hold them up).
  Completions arrive on the rank's one CQ and are handed to the right link by
  :class:`Completions`, which the NIC's driver calls as they are made (no poller task: one
  trio batch less per completion).
* :class:`LocalTx` / :class:`LocalRx` - ranks on the same host (one server's accelerators),
  through its intra-server fabric (:mod:`rocev2_emu.server`: NVLink by default): the data is
  copied into the receiver's slot when written and announced when the fabric delivers it (its
  size over the bandwidth it gets, plus the latency, later); the credit back is a zero-byte
  transfer (the latency).  On a ``free`` fabric both happen at once.
"""

from __future__ import annotations

from collections import deque
from functools import partial
from typing import Final

import numpy as np
import trio

from rocev2_emu.server.fabric import ServerFabric
from rocev2_emu.verbs import (
    CQ,
    MR,
    PD,
    QP,
    Access,
    QPInfo,
    RecvWR,
    SendWR,
    Sge,
    WcOpcode,
    WcStatus,
    WrOpcode,
)

IMM_BITS: Final = 32


class LinkError(Exception):
    """A link broke: the peer's QP failed or completions reported an error."""


class _Waitable:
    def __init__(self) -> None:
        self.changed = trio.lowlevel.ParkingLot()
        self.error: str | None = None

    def fail(self, why: str) -> None:
        """The link broke; the first reason is the one reported (a retry-exhausted send is
        followed by the flush of everything else, which says nothing about the cause)."""
        if self.error is None:
            self.error = why
        self.changed.unpark_all()

    async def _park(self) -> None:
        if self.error:
            raise LinkError(self.error)
        await self.changed.park()
        if self.error:
            raise LinkError(self.error)


class _Receiver(_Waitable):
    """The receiving end's slots and the arrivals waiting in them, in write order."""

    def __init__(self, slots: int, slot_bytes: int, lanes: int = 1) -> None:
        super().__init__()
        self.slots = slots
        self.slot_bytes = slot_bytes
        self.memory = np.zeros(slots * slot_bytes, np.uint8)
        # (immediate, bytes) per lane (QP) in arrival order; item k is on lane k mod lanes
        self.arrivals: list[deque[tuple[int, int]]] = [deque() for _ in range(lanes)]
        self.taken = 0  # arrivals handed out: slots are used in a ring, across operations
        self.received_bytes = 0  # data delivered into the slots, ever (the map's progress)

    def slot(self, index: int, nbytes: int) -> np.ndarray:
        start = index * self.slot_bytes
        return self.memory[start : start + nbytes]

    def deliver(self, imm: int, nbytes: int, lane: int = 0) -> None:
        self.arrivals[lane].append((imm, nbytes))
        self.received_bytes += nbytes
        self.changed.unpark_all()

    async def arrival(self) -> tuple[int, int, int]:
        """The next (immediate, bytes, slot), in the order they were written."""
        lane = self.arrivals[self.taken % len(self.arrivals)]
        while not lane:
            await self._park()
        imm, nbytes = lane.popleft()
        self.taken += 1
        return imm, nbytes, (self.taken - 1) % self.slots


class _Sender(_Waitable):
    """The sending end's credits."""

    def __init__(self, slots: int, slot_bytes: int) -> None:
        super().__init__()
        self.slots = slots
        self.slot_bytes = slot_bytes
        self.credits = slots
        self.used = 0
        self.peak_in_flight = 0  # the most chunks written and not yet granted back

    def credit(self) -> None:
        self.credits += 1
        self.changed.unpark_all()

    async def acquire(self) -> int:
        """A credit: the slot the next write goes to (slots are used in a ring, across
        operations, so a credit always frees the oldest slot)."""
        while self.credits == 0:
            await self._park()
        self.credits -= 1
        self.used += 1
        if self.slots - self.credits > self.peak_in_flight:
            self.peak_in_flight = self.slots - self.credits
        return (self.used - 1) % self.slots


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

    def release(self, index: int) -> None:
        assert self.tx is not None
        self.fabric.send(self.dst, self.src, 0, self.tx.credit)  # the credit: a flag back


class LocalTx(_Sender):
    def __init__(self, rx: LocalRx) -> None:
        super().__init__(rx.slots, rx.slot_bytes)
        self.rx = rx
        rx.tx = self

    async def drain(self) -> None:
        """The source is copied when :meth:`write` returns: nothing to wait for."""

    def write(self, index: int, data: np.ndarray, mr: MR | None, offset: int, imm: int) -> None:
        """Copy ``data`` into slot ``index`` (the slot is this sender's until it is announced)
        and announce it when the server's fabric delivers it."""
        rx = self.rx
        rx.slot(index, data.nbytes)[:] = data
        rx.fabric.send(rx.src, rx.dst, data.nbytes, partial(rx.deliver, imm, data.nbytes))


# -- RDMA ---------------------------------------------------------------------------------


class Completions:
    """Polls a rank's CQ and hands each completion to the link whose QP it belongs to."""

    def __init__(self, cq: CQ) -> None:
        self.cq = cq
        self.by_qpn: dict[int, RdmaTx | RdmaRx] = {}

    def attach(self) -> None:
        """Dispatch from the NIC's driver as completions are made (:meth:`CQ.set_handler`)."""
        self.cq.set_handler(self.dispatch)

    def detach(self) -> None:
        self.cq.set_handler(None)

    def dispatch(self) -> bool:
        """Hand every completion on the CQ to its link; True if there was any (its link's
        waiters were woken).  An error in a link's handling fails every link, so the ranks'
        waits raise it instead of the driver."""
        cq, by_qpn = self.cq, self.by_qpn
        any_ = False
        while True:
            wcs = cq.poll(64)
            if not wcs:
                return any_
            any_ = True
            for wc in wcs:
                link = by_qpn.get(wc.qp_num)
                if link is None:
                    continue
                try:
                    link.on_completion(wc.status, wc.opcode, wc.byte_len, wc.imm_data, wc.qp_num)
                except Exception as exc:  # reported to every waiter, not raised in the driver
                    for other in dict.fromkeys(by_qpn.values()):
                        other.fail(f"handling a completion of {link.peer}: {exc!r}")


class _Rdma(_Waitable):
    """The RC QPs of a link (mixed into both ends): one, or ``qps`` to stripe over, and the
    grants' own QP when ``grant_dscp`` is set."""

    slots: int
    qps: list[QP]  # the data QPs
    grant_qp: QP | None  # the credits' own QP (grant_dscp), or None: credits go on qps
    grant_dscp: int | None
    lane_of: dict[int, int]  # QPN -> its index in all_qps
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
        self.lane_of = {qp.qp_num: k for k, qp in enumerate(self.all_qps)}

    @property
    def all_qps(self) -> list[QP]:
        return self.qps + ([self.grant_qp] if self.grant_qp is not None else [])

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
            qp.post_recv([RecvWR(i) for i in range(2 * self.slots)])

    def on_completion(
        self, status: WcStatus, opcode: WcOpcode, nbytes: int, imm: int | None, qpn: int
    ) -> None:
        if status is not WcStatus.SUCCESS:
            self.fail(f"link with {self.peer}: {opcode.name} completed with {status.name}")
            return
        if opcode in (WcOpcode.RECV, WcOpcode.RECV_RDMA_WITH_IMM):
            lane = self.lane_of[qpn]
            self.all_qps[lane].post_recv(RecvWR(0))
            self.on_receive(nbytes, imm, lane)
        elif opcode is WcOpcode.RDMA_WRITE:
            self.on_written()

    def on_receive(self, nbytes: int, imm: int | None, lane: int) -> None:
        raise NotImplementedError

    def on_written(self) -> None:
        pass

    def close(self) -> None:
        for qp in self.all_qps:
            qp.close()


class RdmaRx(_Rdma, _Receiver):
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

    def on_receive(self, nbytes: int, imm: int | None, lane: int) -> None:
        if imm is None:
            self.fail(f"link with {self.peer}: a data write arrived without an immediate")
            return
        self.deliver(imm, nbytes, lane)
        self.arrived += 1
        held = self.arrived - self.released  # slots holding data not yet granted back
        if held > self.peak_held:
            self.peak_held = held  # more than ``slots`` would be a sender writing ungranted

    def release(self, index: int) -> None:
        """Grant the sender one more slot (clear to send): on the grant QP, else spread over
        the data QPs as the data is."""
        qp = self.grant_qp or self.qps[self.released % len(self.qps)]
        self.released += 1
        qp.post_send(SendWR(1, WrOpcode.SEND_WITH_IMM, [], imm_data=index))


class RdmaTx(_Rdma, _Sender):
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
        self.outstanding = 0  # writes posted and not yet completed: their source is in use

    def on_receive(self, nbytes: int, imm: int | None, lane: int) -> None:
        self.credit()

    def on_written(self) -> None:
        self.outstanding -= 1
        self.changed.unpark_all()

    async def drain(self) -> None:
        """Until every posted write has completed (its source buffer may then change)."""
        while self.outstanding:
            await self._park()

    def write(self, index: int, data: np.ndarray, mr: MR | None, offset: int, imm: int) -> None:
        assert mr is not None
        self.outstanding += 1
        qp = self.qps[self.written % len(self.qps)]
        self.written += 1
        qp.post_send(
            SendWR(
                2,
                WrOpcode.RDMA_WRITE_WITH_IMM,
                [Sge(mr.addr + offset, data.nbytes, mr.lkey)],
                imm_data=imm,
                remote_addr=self.remote_addr + index * self.slot_bytes,
                rkey=self.rkey,
            )
        )


Tx = LocalTx | RdmaTx
Rx = LocalRx | RdmaRx
