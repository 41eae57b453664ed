"""The RC requester: segmentation, PSNs, acknowledgements and go-back-N recovery (sans-IO).

Follows IBTA vol. 1 §9.7 (requester side) and Linux rxe's behaviour where the spec leaves room:

* Work requests get PSNs when posted: SEND/WRITE one per MTU-sized packet, READ one per
  expected response packet, atomics one.  PSNs are 24-bit and wrap.
* AckReq is set on the last packet of a message and every ``ACKREQ_INTERVAL`` packets.
* ACKs are cumulative.  A NAK-sequence-error with PSN p acknowledges everything before p and
  restarts transmission at p (go-back-N).  A READ or atomic response that skips PSNs, or an ACK
  that covers an unanswered READ/atomic, is an *implied NAK*: the request is re-issued for what
  is missing.
* The local ACK timer (4.096 µs × 2^timeout) restarts on progress; on expiry it retransmits from
  the oldest unacknowledged PSN, consuming one of ``retry_cnt`` retries, as does a sequence-error
  NAK that makes no progress.  RNR NAKs wait the responder's RNR delay and consume ``rnr_retry``
  (7: infinite).  Exhaustion completes the head request with RETRY_EXC_ERR / RNR_RETRY_EXC_ERR
  and moves the QP to ERR, flushing everything else.

This module holds the logic only; :class:`~rocev2_emu.transport.qp.QueuePair` owns state and wiring.
"""

from __future__ import annotations

from typing import Final

from rocev2_emu.transport.endpoint import OutPacket, QPEndpoint
from rocev2_emu.transport.qp_state import RNR_RETRY_INFINITE, local_ack_timeout, rnr_delay
from rocev2_emu.transport.work import (
    WC_OPCODE_OF,
    SendWR,
    SgeList,
    WcStatus,
    WorkCompletion,
    WrOpcode,
)
from rocev2_emu.transport.wqe import NAK_STATUS, READ_OR_ATOMIC, READ_RESP_POSITION, SendWqe
from rocev2_emu.wire.bth import (
    AETH_ACK,
    AETH_KIND_MASK,
    AETH_NAK,
    AETH_RNR_NAK,
    AETH_VALUE_MASK,
    PSN_MASK,
    NakCode,
    psn_add,
    psn_diff,
)
from rocev2_emu.wire.bth import Opcode as Op
from rocev2_emu.wire.roce import RoceFrame, pack_atomic_eth, pack_reth

ACKREQ_INTERVAL: Final = 16


class Requester:
    """Send-queue half of an RC QP."""

    def __init__(self, qp: QPEndpoint) -> None:
        self.qp = qp
        # posted, not yet completed, oldest first (a list: 56 bytes empty where a deque is
        # 760, which an all-to-all's million QPs feel; never longer than max_send_wr)
        self.wqes: list[SendWqe] = []
        self.next_psn = 0  # PSN of the next posted WQE
        self.una = 0  # oldest unacknowledged PSN
        self.frontier = 0  # PSN after the highest PSN ever sent
        self.tx_idx = 0  # index in wqes of the WQE to transmit next
        self.tx_pkt = 0  # packet within it (SEND/WRITE)
        self.since_ackreq = 0
        self.retry_left = 0
        self.rnr_left = 0
        self.ack_deadline: float | None = None
        self.rnr_until: float | None = None

    # -- set-up ----------------------------------------------------------------------------
    def start(self, sq_psn: int) -> None:
        self.next_psn = self.una = self.frontier = sq_psn
        self.reset_retries()

    def reset_retries(self) -> None:
        self.retry_left = self.qp.retry_cnt
        self.rnr_left = self.qp.rnr_retry

    def post(self, wr: SendWR, sges: SgeList) -> None:
        wqe = SendWqe(wr, sges, self.next_psn, self.qp.mtu)
        self.next_psn = psn_add(self.next_psn, wqe.npkts)
        self.wqes.append(wqe)

    # -- transmit --------------------------------------------------------------------------

    def next_packet(self, now: float) -> OutPacket | None:
        if self.rnr_until is not None:
            if now < self.rnr_until:
                return None
            self.rnr_until = None
        wqes = self.wqes
        if self.tx_idx >= len(wqes):
            return None
        w = wqes[self.tx_idx]
        kind = w.kind
        qp = self.qp
        if (self.frontier - self.una) & PSN_MASK >= qp.max_inflight and psn_diff(
            self.tx_psn(), self.frontier
        ) >= 0:
            return None  # window full: only retransmissions may go
        if not w.started and not self._may_start(w):
            return None
        if kind in READ_OR_ATOMIC:
            pkt, npsn = self._read_or_atomic(w)
            self.tx_idx += 1
        else:
            k = self.tx_pkt
            n = w.npkts
            mtu = qp.mtu
            self.since_ackreq += 1
            if k == n - 1:  # last (or only) packet: ask for an ACK
                opcode = w.ops[0] if k == 0 else w.ops[3]
                ext = w.first_ext + w.last_ext if k == 0 else w.last_ext
                ackreq, solicited = True, w.solicited
                self.since_ackreq = 0
                self.tx_idx += 1
                self.tx_pkt = 0
                size = w.length - k * mtu
            else:
                opcode, ext = (w.ops[1], w.first_ext) if k == 0 else (w.ops[2], b"")
                solicited = False
                ackreq = self.since_ackreq >= ACKREQ_INTERVAL
                if ackreq:
                    self.since_ackreq = 0
                self.tx_pkt = k + 1
                size = mtu
            payload = w.sges.gather(k * mtu, size)
            pkt = OutPacket(opcode, (w.first_psn + k) & PSN_MASK, ackreq, solicited, ext, payload)
            npsn = 1
        ahead = (pkt.psn + npsn - self.frontier) & PSN_MASK
        if 0 < ahead < 1 << 23:
            self.frontier = (pkt.psn + npsn) & PSN_MASK
        else:
            qp.counters.retransmitted_packets += 1
        if self.ack_deadline is None:
            timeout = local_ack_timeout(qp.timeout)
            if timeout is not None:
                self.ack_deadline = now + timeout
        return pkt

    def _may_start(self, w: SendWqe) -> bool:
        """Whether a WQE may start now (QP state, max_rd_atomic, fence); marks it started."""
        if not self.qp.may_start_new_requests():
            return False
        kind = w.kind
        if kind in READ_OR_ATOMIC or w.fence:
            inflight = sum(1 for i in range(self.tx_idx) if self.wqes[i].kind in READ_OR_ATOMIC)
            if kind in READ_OR_ATOMIC and inflight >= max(1, self.qp.max_rd_atomic):
                return False
            if w.fence and inflight:
                return False
        w.started = True
        return True

    def _read_or_atomic(self, w: SendWqe) -> tuple[OutPacket, int]:
        """The request packet of a READ or atomic and the PSNs it covers."""
        if w.kind is WrOpcode.RDMA_READ:
            return self._read_request(w), w.npkts - w.resp_pkts
        wr = w.wr
        if w.kind is WrOpcode.ATOMIC_CMP_AND_SWP:
            opcode = Op.RC_COMPARE_SWAP
            ext = pack_atomic_eth(wr.remote_addr, wr.rkey, wr.swap, wr.compare_add)
        else:  # ibv_send_wr: compare_add is the addend of a fetch-and-add
            opcode = Op.RC_FETCH_ADD
            ext = pack_atomic_eth(wr.remote_addr, wr.rkey, wr.compare_add, 0)
        return OutPacket(opcode, w.first_psn, False, False, ext, b""), 1

    def _read_request(self, w: SendWqe) -> OutPacket:
        done = w.resp_pkts * self.qp.mtu
        ext = pack_reth(w.wr.remote_addr + done, w.wr.rkey, w.length - done)
        return OutPacket(
            Op.RC_RDMA_READ_REQUEST, psn_add(w.first_psn, w.resp_pkts), False, False, ext, b""
        )

    # -- acknowledgements ------------------------------------------------------------------
    def on_response(self, f: RoceFrame, now: float) -> None:
        psn = f.psn
        if psn_diff(psn, self.frontier) >= 0:
            self.qp.counters.ghost_response += 1
            return
        op = f.opcode
        if op == Op.RC_ACKNOWLEDGE:
            assert f.aeth is not None
            self._on_aeth(psn, f.aeth.syndrome, now)
        elif op == Op.RC_ATOMIC_ACKNOWLEDGE:
            self._on_atomic_ack(f, now)
        else:
            self._on_read_response(f, now)

    def _on_aeth(self, psn: int, syndrome: int, now: float) -> None:
        kind = syndrome & AETH_KIND_MASK
        if psn_diff(psn, self.una) < 0:
            self.qp.counters.duplicate_response += 1  # stale: acknowledges nothing new
            return
        if syndrome & 0x80 or kind not in (AETH_ACK, AETH_RNR_NAK, AETH_NAK):
            # a reserved syndrome (IBTA vol. 1 §9.7.5.2.1, table 44): acknowledges nothing
            self.qp.counters.rx_drops["reserved_aeth_syndrome"] += 1
            return
        if kind == AETH_ACK:
            self._ack_through(psn, now)
            return
        before = self.una
        self._ack_through(psn_add(psn, -1), now)
        if not self.wqes or self.qp.in_error():
            return
        code = syndrome & AETH_VALUE_MASK
        if kind == AETH_RNR_NAK:
            self.qp.counters.rnr_nak_received += 1
            if self.qp.rnr_retry != RNR_RETRY_INFINITE:
                if self.rnr_left == 0:
                    self.qp.counters.rnr_nak_retry_err += 1
                    self.qp.fail(WcStatus.RNR_RETRY_EXC_ERR)
                    return
                self.rnr_left -= 1
            self.rnr_until = now + rnr_delay(code)
            self.ack_deadline = None
            self._seek(psn)
        elif kind == AETH_NAK and code == NakCode.PSN_SEQUENCE_ERROR:
            self.qp.counters.packet_seq_err += 1
            if self.una == before:
                if self.retry_left == 0:
                    self.qp.counters.retry_exceeded_err += 1
                    self.qp.fail(WcStatus.RETRY_EXC_ERR)
                    return
                self.retry_left -= 1
            self._seek(psn)
        elif kind == AETH_NAK:
            if code == NakCode.REMOTE_ACCESS_ERROR:
                self.qp.counters.req_remote_access_errors += 1
            elif code == NakCode.INVALID_REQUEST:
                self.qp.counters.req_remote_invalid_request += 1
            self.qp.fail(
                NAK_STATUS.get(
                    NakCode(code) if code <= 4 else NakCode.INVALID_REQUEST, WcStatus.REM_OP_ERR
                )
            )

    def _ack_through(self, psn: int, now: float) -> None:
        """Everything up to and including ``psn`` has been received by the responder."""
        if psn_diff(psn, self.una) < 0:
            return
        progressed = False
        while self.wqes:
            w = self.wqes[0]
            if psn_diff(w.last_psn, psn) > 0:
                if w.kind not in READ_OR_ATOMIC and psn_diff(psn, self.una) >= 0:
                    self.una = psn_add(psn, 1)  # partial ACK inside a multi-packet message
                    progressed = True
                elif w.kind in READ_OR_ATOMIC and psn_diff(psn, w.first_psn) >= 0:
                    self._implied_nak(w)
                break
            if w.kind in READ_OR_ATOMIC:
                self._implied_nak(w)
                break
            self._complete_head(WcStatus.SUCCESS)
            self.una = psn_add(w.last_psn, 1)
            progressed = True
        if progressed:
            self._on_progress(now)

    def _on_progress(self, now: float) -> None:
        self.reset_retries()
        if psn_diff(self.tx_psn(), self.una) < 0:
            self._seek(self.una)
        if psn_diff(self.frontier, self.una) > 0:
            timeout = local_ack_timeout(self.qp.timeout)
            self.ack_deadline = None if timeout is None else now + timeout
        else:
            self.ack_deadline = None

    def _implied_nak(self, w: SendWqe) -> None:
        resume = psn_add(w.first_psn, w.resp_pkts)
        if w.rerequest_psn == resume:
            return  # already re-requested from here; the ACK timer covers its loss
        self.qp.counters.implied_nak_seq_err += 1
        w.rerequest_psn = resume
        self._seek(resume)

    def _on_read_response(self, f: RoceFrame, now: float) -> None:
        psn = f.psn
        w = self._wqe_of(psn)
        if w is None or w.kind is not WrOpcode.RDMA_READ:
            self.qp.counters.duplicate_response += 1
            return
        self._ack_through(psn_add(w.first_psn, -1), now)
        if not self.wqes or self.wqes[0] is not w:
            return
        d = psn_diff(psn, psn_add(w.first_psn, w.resp_pkts))
        if d < 0:
            self.qp.counters.duplicate_response += 1
            return
        if d > 0:
            self._implied_nak(w)
            return
        k = w.resp_pkts
        mtu = self.qp.mtu
        want = min(mtu, w.length - k * mtu)
        # A re-issued READ is answered FIRST..LAST from its own start, so only the "last"
        # position is checked; a response that does not fit is stale and dropped.
        if READ_RESP_POSITION[Op(f.opcode)][1] != (k == w.npkts - 1) or len(f.payload) != want:
            self.qp.counters.duplicate_response += 1
            return
        w.sges.scatter(k * mtu, f.payload)
        w.resp_pkts += 1
        self.una = psn_add(psn, 1)
        if w.resp_pkts == w.npkts:
            self._complete_head(WcStatus.SUCCESS)
        self._on_progress(now)

    def _on_atomic_ack(self, f: RoceFrame, now: float) -> None:
        w = self._wqe_of(f.psn)
        if w is None or w.kind not in READ_OR_ATOMIC or w.kind is WrOpcode.RDMA_READ:
            self.qp.counters.duplicate_response += 1
            return
        self._ack_through(psn_add(w.first_psn, -1), now)
        if not self.wqes or self.wqes[0] is not w:
            return
        assert f.atomic_ack is not None
        w.sges.scatter(0, f.atomic_ack.to_bytes(8, "little"))
        self.una = psn_add(f.psn, 1)
        self._complete_head(WcStatus.SUCCESS)
        self._on_progress(now)

    # -- timers ----------------------------------------------------------------------------
    def get_timer(self) -> float | None:
        ack, rnr = self.ack_deadline, self.rnr_until
        if ack is None:
            return rnr
        return ack if rnr is None or ack < rnr else rnr

    def handle_timer(self, now: float) -> None:
        if self.rnr_until is not None and now >= self.rnr_until:
            self.rnr_until = None
        if self.ack_deadline is None or now < self.ack_deadline:
            return
        self.ack_deadline = None
        if psn_diff(self.frontier, self.una) <= 0 or not self.wqes:
            return
        self.qp.counters.local_ack_timeout_err += 1
        if self.retry_left == 0:
            self.qp.counters.retry_exceeded_err += 1
            self.qp.fail(WcStatus.RETRY_EXC_ERR)
            return
        self.retry_left -= 1
        w = self.wqes[0]
        if w.kind in READ_OR_ATOMIC:
            w.rerequest_psn = psn_add(w.first_psn, w.resp_pkts)
        self._seek(self.una)

    # -- helpers ---------------------------------------------------------------------------
    def tx_psn(self) -> int:
        if self.tx_idx >= len(self.wqes):
            return self.next_psn
        w = self.wqes[self.tx_idx]
        if w.kind is WrOpcode.RDMA_READ:
            return psn_add(w.first_psn, w.resp_pkts)
        return psn_add(w.first_psn, self.tx_pkt)

    def _wqe_of(self, psn: int) -> SendWqe | None:
        for w in self.wqes:
            d = psn_diff(psn, w.first_psn)
            if 0 <= d < w.npkts:
                return w
        return None

    def _seek(self, psn: int) -> None:
        """Point the transmitter at ``psn`` (go-back-N)."""
        for i, w in enumerate(self.wqes):
            d = psn_diff(psn, w.first_psn)
            if 0 <= d < w.npkts:
                self.tx_idx = i
                self.tx_pkt = d if w.kind not in READ_OR_ATOMIC else 0
                self.since_ackreq = 0
                return
        self.tx_idx = len(self.wqes)
        self.tx_pkt = 0

    def _complete_head(self, status: WcStatus) -> None:
        w = self.wqes.pop(0)
        if self.tx_idx == 0:
            self.tx_pkt = 0  # the transmitter pointed into the WQE just completed
        else:
            self.tx_idx -= 1
        if status is WcStatus.WR_FLUSH_ERR:
            self.qp.counters.req_cqe_flush_error += 1
        elif status is not WcStatus.SUCCESS:
            self.qp.counters.req_cqe_error += 1
        if status is not WcStatus.SUCCESS or w.signaled or self.qp.sq_sig_all:
            self.qp.send_cq.push(
                WorkCompletion(
                    w.wr.wr_id,
                    status,
                    WC_OPCODE_OF[w.kind],
                    w.length if status is WcStatus.SUCCESS else 0,
                    self.qp.qpn,
                )
            )

    def flush(self, head_status: WcStatus | None) -> None:
        """Complete every outstanding WQE: the head with ``head_status``, the rest flushed."""
        first = True
        while self.wqes:
            status = head_status if first and head_status is not None else WcStatus.WR_FLUSH_ERR
            self._complete_head(status)
            first = False
        self.tx_idx = self.tx_pkt = 0
        self.ack_deadline = self.rnr_until = None
