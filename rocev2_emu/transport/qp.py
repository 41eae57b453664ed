"""An RC queue pair: attributes, state, and the wiring of requester and responder (sans-IO).

``modify`` applies :mod:`rocev2_emu.transport.qp_state`'s table; ``post_send`` / ``post_recv``
validate work requests against registered memory (a local error for misuse); ``receive`` routes a
decoded frame to the requester (responses) or the responder (requests); ``next_packet`` hands
the NIC the next packet to frame - responses before requests, so ACKs are not stuck behind a
long message.  Errors move the QP to ERR and flush every outstanding work request.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Final

from rocev2_emu.transport.counters import NicCounters
from rocev2_emu.transport.endpoint import OutPacket, QPEndpoint
from rocev2_emu.transport.errors import LocalVerbsError
from rocev2_emu.transport.memory import Access, MemoryTable, ProtectionDomain
from rocev2_emu.transport.qp_state import (
    QPAttr,
    QPState,
    can_post_recv,
    can_post_send,
    check_transition,
)
from rocev2_emu.transport.requester import Requester
from rocev2_emu.transport.responder import Responder
from rocev2_emu.transport.work import (
    WC_OPCODE_OF,
    CompletionQueue,
    RecvWR,
    SendWR,
    SgeList,
    WcOpcode,
    WcStatus,
    WorkCompletion,
    WrOpcode,
)
from rocev2_emu.wire.bth import Opcode as Op
from rocev2_emu.wire.roce import FrameTemplate

if TYPE_CHECKING:
    from rocev2_emu.cc import RateControl
    from rocev2_emu.wire.roce import RoceFrame

RESPONSE_OPCODES: Final = frozenset(
    {
        Op.RC_RDMA_READ_RESPONSE_FIRST,
        Op.RC_RDMA_READ_RESPONSE_MIDDLE,
        Op.RC_RDMA_READ_RESPONSE_LAST,
        Op.RC_RDMA_READ_RESPONSE_ONLY,
        Op.RC_ACKNOWLEDGE,
        Op.RC_ATOMIC_ACKNOWLEDGE,
    }
)
MAX_MESSAGE: Final = 1 << 31
# Packets a requester keeps unacknowledged before it waits (go-back-N costs up to this much per
# loss).  IBTA sets no window; real NICs are bounded by the bandwidth-delay product, which an
# unpaced emulated link does not have.
DEFAULT_MAX_INFLIGHT: Final = 512
NO_DEADLINE: Final = -1.0  # a QP with no deadline on its NIC's heap (nic.deadlines)


class QueuePair(QPEndpoint):
    """One RC QP of a NIC."""

    def __init__(
        self,
        *,
        qpn: int,
        pd: ProtectionDomain,
        send_cq: CompletionQueue,
        recv_cq: CompletionQueue,
        mrs: MemoryTable,
        counters: NicCounters,
        max_send_wr: int = 1024,
        max_recv_wr: int = 1024,
        sq_sig_all: bool = False,
    ) -> None:
        self.qpn = qpn
        self.pd = pd
        self.send_cq = send_cq
        self.recv_cq = recv_cq
        self.mrs = mrs
        self.counters = counters
        self.max_send_wr = max_send_wr
        self.max_recv_wr = max_recv_wr
        self.sq_sig_all = sq_sig_all
        self.state = QPState.RESET
        self.access = Access.NONE
        self.mtu = 1024
        self.dest_qpn = 0
        self.dest_ip: str | None = None
        self.max_dest_rd_atomic = 1
        self.min_rnr_timer = 0
        self.timeout = 14
        self.retry_cnt = 7
        self.rnr_retry = 7
        self.max_rd_atomic = 1
        self.last_error = ""
        self.max_inflight = DEFAULT_MAX_INFLIGHT
        self.timing_only = False  # the NIC's: what arrives is not written to memory
        self.traffic_class: int | None = None  # DSCP of this QP's packets (ah_attr.grh)
        self.priority = 3  # 802.1p priority, set by the NIC from the DSCP
        self.rc: RateControl | None = None  # rate control, set by the NIC at RTS
        self.last_cnp = -1.0  # notification point: when this QP last sent a CNP
        self.deadline = NO_DEADLINE  # its live entry on the NIC's deadline heap
        self.alive = True  # the NIC's: False once destroyed (destroy_qp)
        self.nic_touched = False  # its NIC is to re-read its deadline (Deadlines.touch)
        self.peer_ip = -1  # the NIC's: its peer's address, set at RTR (-1: none yet)
        self.template: FrameTemplate | None = None  # the NIC's: its frames' headers, memoized
        self.cnp_template: FrameTemplate | None = None  # the NIC's: its CNPs' headers
        self.requester = Requester(self)
        self.responder = Responder(self)

    def from_peer(self, ip: int) -> bool:
        """Whether a packet from ``ip`` may be this QP's: its peer's address, or any before
        RTR, when it has none (rxe's check_addr)."""
        return self.peer_ip < 0 or self.peer_ip == ip

    def __repr__(self) -> str:
        return f"QueuePair(qpn=0x{self.qpn:06x}, state={self.state.name})"

    # -- control ---------------------------------------------------------------------------
    def modify(self, attr: QPAttr) -> QPState:
        target = check_transition(self.state, attr)
        for name in attr.mask():
            value = getattr(attr, name)
            if name == "qp_access_flags":
                self.access = Access(value)
            elif name == "path_mtu":
                self.mtu = value
            elif name == "dest_qp_num":
                self.dest_qpn = value
            elif name == "ah_attr":  # one string a destination, however many QPs reach it
                self.dest_ip = sys.intern(value) if isinstance(value, str) else value
            elif name == "traffic_class":
                self.traffic_class = value
            elif name in (
                "max_dest_rd_atomic",
                "min_rnr_timer",
                "timeout",
                "retry_cnt",
                "rnr_retry",
                "max_rd_atomic",
            ):
                setattr(self, name, value)
        previous = self.state
        if target is QPState.ERR:
            self.fail(None)
            return self.state
        if target is QPState.RESET:
            self.requester.flush(None)
            self.responder.flush()
            self.requester = Requester(self)
            self.responder = Responder(self)
        if target is QPState.RTR and attr.rq_psn is not None:
            self.responder.start(attr.rq_psn)
        if target is QPState.RTS and attr.sq_psn is not None and previous is QPState.RTR:
            self.requester.start(attr.sq_psn)
        if attr.retry_cnt is not None or attr.rnr_retry is not None:
            self.requester.reset_retries()
        self.state = target
        return target

    def fail(self, head_status: WcStatus | None) -> None:
        """Move to ERR; the head send WQE completes with ``head_status``, all else flushes."""
        self.state = QPState.ERR
        self.requester.flush(head_status)
        self.responder.flush()

    def in_error(self) -> bool:
        return self.state is QPState.ERR

    def may_start_new_requests(self) -> bool:
        return self.state is QPState.RTS

    # -- work requests ---------------------------------------------------------------------
    def post_send(self, wr: SendWR) -> None:
        if not can_post_send(self.state):
            raise LocalVerbsError(f"post_send on QP 0x{self.qpn:06x} in state {self.state.name}")
        if len(self.requester.wqes) >= self.max_send_wr:
            raise LocalVerbsError(
                f"send queue of QP 0x{self.qpn:06x} is full ({self.max_send_wr} outstanding)"
            )
        op = wr.opcode
        if not isinstance(op, WrOpcode):  # an int (the pure build lets one in): checked here
            op = WrOpcode(op)  # an enum's call is ~3 000 instructions: not per compiled post
        need = Access.NONE
        if op in (WrOpcode.RDMA_READ, WrOpcode.ATOMIC_CMP_AND_SWP, WrOpcode.ATOMIC_FETCH_AND_ADD):
            need = Access.LOCAL_WRITE
        sges = SgeList.resolve(wr.sg_list, self.mrs, self.pd, need)
        if sges.length > MAX_MESSAGE:
            raise LocalVerbsError(f"message of {sges.length} bytes > 2^31")
        if op in (WrOpcode.ATOMIC_CMP_AND_SWP, WrOpcode.ATOMIC_FETCH_AND_ADD) and (
            sges.length != 8 or wr.remote_addr % 8
        ):
            raise LocalVerbsError(
                "atomics need one 8-byte SGE and an 8-byte aligned "
                f"remote_addr (got {sges.length} bytes at 0x{wr.remote_addr:x})"
            )
        if op in (WrOpcode.SEND_WITH_IMM, WrOpcode.RDMA_WRITE_WITH_IMM) and (
            wr.imm_data is None or not 0 <= wr.imm_data < 1 << 32
        ):
            raise LocalVerbsError(f"{op.name} needs 32-bit imm_data, got {wr.imm_data!r}")
        if self.state is QPState.ERR:
            self.send_cq.push(
                WorkCompletion(wr.wr_id, WcStatus.WR_FLUSH_ERR, WC_OPCODE_OF[op], 0, self.qpn)
            )
            return
        self.requester.post(wr, sges)

    def post_recv(self, wr: RecvWR) -> None:
        if not can_post_recv(self.state):
            raise LocalVerbsError(f"post_recv on QP 0x{self.qpn:06x} in state {self.state.name}")
        if len(self.responder.recvs) >= self.max_recv_wr:
            raise LocalVerbsError(f"receive queue of QP 0x{self.qpn:06x} is full")
        sges = SgeList.resolve(wr.sg_list, self.mrs, self.pd, Access.LOCAL_WRITE)
        if self.state is QPState.ERR:
            self.recv_cq.push(
                WorkCompletion(wr.wr_id, WcStatus.WR_FLUSH_ERR, WcOpcode.RECV, 0, self.qpn)
            )
            return
        self.responder.post(wr, sges)

    # -- packets ---------------------------------------------------------------------------
    def receive(self, f: RoceFrame, now: float) -> bool:
        """Handle one frame addressed to this QP; False when the QP's state drops it."""
        if f.opcode in RESPONSE_OPCODES:
            if self.state not in (QPState.RTS, QPState.SQD):
                return False
            self.requester.on_response(f, now)
            return True
        if self.state not in (QPState.RTR, QPState.RTS, QPState.SQD):
            return False
        self.responder.on_request(f)
        return True

    def next_packet(self, now: float) -> OutPacket | None:
        pkt = self.responder.next_packet()
        if pkt is not None or self.state not in (QPState.RTS, QPState.SQD):
            return pkt
        return self.requester.next_packet(now)

    def get_timer(self) -> float | None:
        """The requester's (ACK, RNR) or the rate control's next deadline, whichever is first."""
        if self.state not in (QPState.RTS, QPState.SQD):
            return None
        t = self.requester.get_timer()
        if self.rc is not None and (r := self.rc.get_timer()) is not None and (t is None or r < t):
            return r
        return t

    def handle_timer(self, now: float) -> None:
        if self.state in (QPState.RTS, QPState.SQD):
            self.requester.handle_timer(now)
            rc = self.rc
            if rc is not None and (t := rc.get_timer()) is not None and t <= now:
                rc.handle_timer(now=now)
