"""The RC responder: expected-PSN tracking, request execution, ACK/NAK generation (sans-IO).

Follows IBTA vol. 1 §9.7.4-9.7.5 (responder side):

* A request with the expected PSN is executed.  One ahead of it starts an out-of-sequence
  episode: one NAK-sequence-error naming the expected PSN, then silent drops until the expected
  PSN arrives.  One behind it is a duplicate: SEND/WRITE are re-acknowledged (when they ask for
  an ACK), a READ is replayed from memory, an atomic is answered from its saved result and
  never executed twice (the last ``max_dest_rd_atomic`` READs/atomics are remembered).
* A SEND that finds no posted receive gets an RNR NAK carrying ``min_rnr_timer``.
* Remote access is checked in the spec's order - rkey, protection domain, bounds, access rights -
  before any byte is written; a failure answers NAK remote-access-error with memory untouched,
  and a bad opcode sequence or length answers NAK invalid-request.  Both are fatal for the QP.
* Responses leave in PSN order through one FIFO; consecutive ACKs coalesce into the newest.
"""

from __future__ import annotations

from rocev2_emu.transport.endpoint import OutPacket, QPEndpoint
from rocev2_emu.transport.memory import Access, MemoryRegion
from rocev2_emu.transport.responses import (
    ATOMIC_OPS,
    LAST_OPS,
    MORE_OPS,
    SEND_FIRST_OPS,
    SEND_MORE_OPS,
    U64,
    WRITE_FIRST_OPS,
    WRITE_MORE_OPS,
    AccessDenied,
    Ack,
    AtomicAck,
    ReadResponse,
    Resource,
    ResponseItem,
)
from rocev2_emu.transport.work import RecvWR, SgeList, WcOpcode, WcStatus, WorkCompletion
from rocev2_emu.wire.bth import (
    AETH_ACK,
    AETH_NAK,
    AETH_RNR_NAK,
    PSN_MASK,
    NakCode,
    Reth,
    psn_add,
    psn_diff,
)
from rocev2_emu.wire.bth import Opcode as Op
from rocev2_emu.wire.roce import RoceFrame, pack_aeth, pack_atomic_ack


class Responder:
    """Receive-queue half of an RC QP."""

    def __init__(self, qp: QPEndpoint) -> None:
        self.qp = qp
        self.epsn = 0
        self.msn = 0
        # FIFOs as lists (56 bytes empty where a deque is 760; each a few entries long)
        # posted receives, oldest first, and their SGEs beside them (two lists, not a tuple a
        # post: a link of a collective keeps a receive posted per slot, an all-to-all a link
        # per peer)
        self.recvs: list[RecvWR] = []
        self.recv_sges: list[SgeList] = []
        self.in_send: tuple[RecvWR, SgeList] | None = None
        self.in_write = False
        self.offset = 0  # bytes of the current SEND / WRITE received so far
        self.write_view: memoryview | None = None
        self.write_mr: MemoryRegion | None = None  # checked per packet: deregistration revokes
        self.write_len = 0
        self.in_nak_episode = False
        self.resources: list[Resource] = []
        self.out: list[ResponseItem] = []
        self.rx_bytes = 0  # payload bytes taken in order: goodput, for measurements

    def start(self, rq_psn: int) -> None:
        self.epsn = rq_psn

    # -- requests --------------------------------------------------------------------------
    def on_request(self, f: RoceFrame) -> None:
        psn = f.psn
        if psn == self.epsn and self.in_write and f.opcode == Op.RC_RDMA_WRITE_MIDDLE:
            # The body of a multi-packet WRITE, by far the commonest packet: same rules as the
            # general path below (full MTU, inside the announced length), fewer steps.
            payload = f.payload
            n = len(payload)
            off = self.offset
            mr = self.write_mr
            if n == self.qp.mtu and off + n < self.write_len and mr is not None and mr.valid:
                assert self.write_view is not None
                if not self.qp.timing_only:  # (timing only: the zeros of an elided payload)
                    self.write_view[off : off + n] = payload
                self.offset = off + n
                self.rx_bytes += n
                self.epsn = (psn + 1) & PSN_MASK
                self.in_nak_episode = False
                if f.ackreq:
                    self._ack(psn, AETH_ACK)
                return
        d = psn_diff(psn, self.epsn)
        if d > 0:
            self.qp.counters.out_of_sequence += 1
            if not self.in_nak_episode:
                self.in_nak_episode = True
                self._ack(self.epsn, AETH_NAK | NakCode.PSN_SEQUENCE_ERROR)
            return
        if d < 0:
            self._duplicate(f)
            return
        op = f.opcode
        if (
            (self.in_send is not None and op not in SEND_MORE_OPS)
            or (self.in_write and op not in WRITE_MORE_OPS)
            or (self.in_send is None and not self.in_write and op in MORE_OPS)
        ):
            self._fatal(NakCode.INVALID_REQUEST, f"opcode 0x{op:02x} out of sequence")
            return
        try:
            if op in SEND_FIRST_OPS or op in SEND_MORE_OPS:
                done = self._send(f)
            elif op in WRITE_FIRST_OPS or op in WRITE_MORE_OPS:
                done = self._write(f)
            elif op == Op.RC_RDMA_READ_REQUEST:
                done = self._read(f)
            elif op in ATOMIC_OPS:
                done = self._atomic(f)
            else:
                self._fatal(NakCode.INVALID_REQUEST, f"opcode 0x{op:02x} not valid on an RC QP")
                return
        except AccessDenied:
            return
        if done:
            self.in_nak_episode = False

    def _payload_ok(self, f: RoceFrame) -> bool:
        n = len(f.payload)
        mtu = self.qp.mtu
        if f.opcode in LAST_OPS:
            return n <= mtu
        return n == mtu

    def _send(self, f: RoceFrame) -> bool:
        op = f.opcode
        if op in SEND_FIRST_OPS:
            if not self.recvs:
                self._rnr(f.psn)
                return False
            self.in_send = self._next_recv()
            self.offset = 0
        assert self.in_send is not None
        wr, sges = self.in_send
        if not self._payload_ok(f):
            self._fatal(NakCode.INVALID_REQUEST, f"SEND payload of {len(f.payload)} bytes")
            return False
        n = len(f.payload)
        if self.offset + n > sges.length:
            self.qp.counters.resp_local_length_error += 1
            self.qp.recv_cq.push(
                WorkCompletion(wr.wr_id, WcStatus.LOC_LEN_ERR, WcOpcode.RECV, 0, self.qp.qpn)
            )
            self.in_send = None
            self._fatal(NakCode.INVALID_REQUEST, f"SEND of > {sges.length} bytes overflows receive")
            return False
        if not self.qp.timing_only:
            sges.scatter(self.offset, f.payload)
        self.rx_bytes += n
        self.offset += n
        self._advance(f, 1)
        if op in LAST_OPS:
            self.in_send = None
            self.msn += 1
            self.qp.recv_cq.push(
                WorkCompletion(
                    wr.wr_id, WcStatus.SUCCESS, WcOpcode.RECV, self.offset, self.qp.qpn, f.imm
                )
            )
            self._ack_if_asked(f)
        elif f.ackreq:
            self._ack(f.psn, AETH_ACK)
        return True

    def _write(self, f: RoceFrame) -> bool:
        op = f.opcode
        if op in WRITE_FIRST_OPS:
            reth = f.reth
            assert reth is not None
            mr = self._check_remote(reth, Access.REMOTE_WRITE, reth.dma_len)
            self.write_mr = mr
            self.write_view = mr.view(reth.va, reth.dma_len) if mr is not None else None
            self.write_len = reth.dma_len
            self.offset = 0
            self.in_write = True
            self.qp.counters.rx_write_requests += 1
        n = len(f.payload)
        if (
            not self._payload_ok(f)
            or self.offset + n > self.write_len
            or (op in LAST_OPS and self.offset + n != self.write_len)
        ):
            self._fatal(
                NakCode.INVALID_REQUEST,
                f"WRITE payload {n} at offset {self.offset} of {self.write_len}",
            )
            return False
        recv = None
        if op in (Op.RC_RDMA_WRITE_LAST_WITH_IMMEDIATE, Op.RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE):
            if not self.recvs:
                self._rnr(f.psn)
                return False
            recv = self._next_recv()
        if n:
            assert self.write_view is not None and self.write_mr is not None
            if not self.write_mr.valid:  # deregistered while the WRITE was arriving: revoked
                self.qp.counters.resp_remote_access_errors += 1
                why = f"rkey 0x{self.write_mr.rkey:08x} was deregistered during the WRITE"
                self._fatal(NakCode.REMOTE_ACCESS_ERROR, why)
                self.write_view = self.write_mr = None
                return False
            if not self.qp.timing_only:
                self.write_view[self.offset : self.offset + n] = f.payload
            self.rx_bytes += n
        self.offset += n
        self._advance(f, 1)
        if op in LAST_OPS:
            self.in_write = False
            self.write_view = self.write_mr = None
            self.msn += 1
            if recv is not None:
                self.qp.recv_cq.push(
                    WorkCompletion(
                        recv[0].wr_id,
                        WcStatus.SUCCESS,
                        WcOpcode.RECV_RDMA_WITH_IMM,
                        self.write_len,
                        self.qp.qpn,
                        f.imm,
                    )
                )
            self._ack_if_asked(f)
        elif f.ackreq:
            self._ack(f.psn, AETH_ACK)
        return True

    def _read(self, f: RoceFrame) -> bool:
        reth = f.reth
        assert reth is not None
        mr = self._check_remote(reth, Access.REMOTE_READ, reth.dma_len)
        self.qp.counters.rx_read_requests += 1
        resp = ReadResponse(mr, reth.va, reth.dma_len, f.psn, self.qp.mtu)
        self._remember(Resource(f.psn, resp.npkts, None))
        self.out.append(resp)
        self.msn += 1
        self.epsn = psn_add(self.epsn, resp.npkts)
        return True

    def _atomic(self, f: RoceFrame) -> bool:
        a = f.atomic_eth
        assert a is not None
        mr = self._check_remote(Reth(a.va, a.rkey, 8), Access.REMOTE_ATOMIC, 8)
        if mr is None or a.va % 8:
            self._fatal(NakCode.INVALID_REQUEST, f"atomic VA 0x{a.va:x} is not 8-byte aligned")
            return False
        self.qp.counters.rx_atomic_requests += 1
        cell = mr.view(a.va, 8)
        orig = int.from_bytes(cell, "little")
        if f.opcode == Op.RC_COMPARE_SWAP:
            new = a.swap_add if orig == a.compare else orig
        else:
            new = (orig + a.swap_add) & U64
        cell[:] = new.to_bytes(8, "little")
        self._remember(Resource(f.psn, 1, orig))
        self.msn += 1
        self.out.append(AtomicAck(f.psn, orig, self.msn))
        self._advance(f, 1)
        return True

    def _duplicate(self, f: RoceFrame) -> None:
        self.qp.counters.duplicate_request += 1
        op = f.opcode
        if op == Op.RC_RDMA_READ_REQUEST:
            res = self._resource_of(f.psn)
            reth = f.reth
            if res is None or res.orig is not None or reth is None:
                return
            try:
                mr = self._check_remote(reth, Access.REMOTE_READ, reth.dma_len, fatal=False)
            except AccessDenied:
                return
            # The requester has gone back to this PSN and will resend everything after it,
            # so answer from here in PSN order: drop what is still queued for this READ and
            # for later requests (as rxe reuses the resource), then replay.
            self._truncate_from(res.first_psn)
            self.out.append(ReadResponse(mr, reth.va, reth.dma_len, f.psn, self.qp.mtu))
        elif op in ATOMIC_OPS:
            res = self._resource_of(f.psn)
            if res is not None and res.orig is not None and res.first_psn == f.psn:
                self.out.append(AtomicAck(f.psn, res.orig, self.msn))
        elif f.ackreq or op in LAST_OPS:
            self._ack(psn_add(self.epsn, -1), AETH_ACK)

    # -- checks and helpers ----------------------------------------------------------------
    def _check_remote(
        self, reth: Reth, need: Access, length: int, fatal: bool = True
    ) -> MemoryRegion | None:
        """The MR for a remote access, None for a zero-length one (IBTA C9-88: no checks).

        Raises AccessDenied, after queueing the NAK when ``fatal``."""
        if length == 0:
            return None
        mr = self.qp.mrs.by_rkey(reth.rkey)
        if mr is None or not mr.valid:
            why = f"rkey 0x{reth.rkey:08x} names no memory region"
        elif mr.pd is not self.qp.pd:
            why = f"rkey 0x{reth.rkey:08x} belongs to another protection domain"
        elif not mr.contains(reth.va, length):
            why = f"[0x{reth.va:x}, +{length}) outside MR [0x{mr.addr:x}, +{mr.length})"
        elif not int(mr.access) & int(need) or not int(self.qp.access) & int(need):
            why = f"{need.name} not granted (MR {mr.access!r}, QP {self.qp.access!r})"
        else:
            return mr
        if fatal:
            self.qp.counters.resp_remote_access_errors += 1
            self._fatal(NakCode.REMOTE_ACCESS_ERROR, why)
        raise AccessDenied(why)

    def _advance(self, f: RoceFrame, n: int) -> None:
        self.epsn = psn_add(f.psn, n)

    def _ack_if_asked(self, f: RoceFrame) -> None:
        # The last packet of a message always carries AckReq from our requester; honour a
        # peer that leaves it clear by acknowledging message ends anyway.
        self._ack(f.psn, AETH_ACK)

    def _ack(self, psn: int, syndrome: int) -> None:
        if syndrome == AETH_ACK and self.out:
            tail = self.out[-1]
            if isinstance(tail, Ack) and tail.syndrome == AETH_ACK:
                self.out[-1] = Ack(psn, syndrome, self.msn)
                return
        self.out.append(Ack(psn, syndrome, self.msn))

    def _rnr(self, psn: int) -> None:
        self.qp.counters.out_of_buffer += 1
        self.in_nak_episode = True
        self._ack(psn, AETH_RNR_NAK | self.qp.min_rnr_timer)

    def _fatal(self, code: NakCode, why: str) -> None:
        if code == NakCode.INVALID_REQUEST:
            self.qp.counters.resp_invalid_request += 1
        self.qp.last_error = f"responder: {code.name}: {why}"
        self.out.clear()
        self.out.append(Ack(self.epsn, AETH_NAK | code, self.msn))
        self.qp.fail(None)

    def _truncate_from(self, psn: int) -> None:
        kept: list[ResponseItem] = []
        for item in self.out:
            if psn_diff(item.first_psn, psn) >= 0:
                break
            kept.append(item)
        self.out = kept

    def _remember(self, res: Resource) -> None:
        self.resources.append(res)
        while len(self.resources) > max(1, self.qp.max_dest_rd_atomic):
            self.resources.pop(0)

    def _resource_of(self, psn: int) -> Resource | None:
        for res in self.resources:
            if 0 <= psn_diff(psn, res.first_psn) < res.npkts:
                return res
        return None

    # -- responses -------------------------------------------------------------------------
    def next_packet(self) -> OutPacket | None:
        if not self.out:
            return None
        item = self.out[0]
        if isinstance(item, ReadResponse):
            return self._read_packet(item)
        self.out.pop(0)
        if isinstance(item, Ack):
            ext = pack_aeth(item.syndrome, item.msn)
            return OutPacket(Op.RC_ACKNOWLEDGE, item.first_psn, False, False, ext, b"")
        ext = pack_aeth(AETH_ACK, item.msn) + pack_atomic_ack(item.orig)
        return OutPacket(Op.RC_ATOMIC_ACKNOWLEDGE, item.first_psn, False, False, ext, b"")

    def _read_packet(self, r: ReadResponse) -> OutPacket:
        k = r.next_pkt
        r.next_pkt += 1
        if r.next_pkt == r.npkts:
            self.out.pop(0)
        first, last = k == 0, k == r.npkts - 1
        if first and last:
            op = Op.RC_RDMA_READ_RESPONSE_ONLY
        elif first:
            op = Op.RC_RDMA_READ_RESPONSE_FIRST
        elif last:
            op = Op.RC_RDMA_READ_RESPONSE_LAST
        else:
            op = Op.RC_RDMA_READ_RESPONSE_MIDDLE
        ext = pack_aeth(AETH_ACK, self.msn) if first or last else b""
        mtu = self.qp.mtu
        off = k * mtu
        n = min(mtu, r.length - off)
        payload: bytes | memoryview = b""
        if n > 0 and r.mr is not None:
            if not r.mr.valid:  # deregistered while being read: revoke, never leak memory
                self.out.clear()
                self.qp.counters.resp_remote_access_errors += 1
                self.qp.last_error = "responder: MR deregistered during an RDMA READ"
                self.qp.fail(None)
                return OutPacket(
                    Op.RC_ACKNOWLEDGE,
                    psn_add(r.first_psn, k),
                    False,
                    False,
                    pack_aeth(AETH_NAK | NakCode.REMOTE_ACCESS_ERROR, self.msn),
                    b"",
                )
            payload = r.mr.view(r.va + off, n)
        return OutPacket(op, psn_add(r.first_psn, k), False, False, ext, payload)

    def post(self, wr: RecvWR, sges: SgeList) -> None:
        """A receive posted (its SGEs resolved): taken in post order."""
        self.recvs.append(wr)
        self.recv_sges.append(sges)

    def _next_recv(self) -> tuple[RecvWR, SgeList]:
        return self.recvs.pop(0), self.recv_sges.pop(0)

    def flush(self) -> None:
        """Complete every posted receive with WR_FLUSH_ERR."""
        pending = ([self.in_send[0]] if self.in_send is not None else []) + self.recvs
        self.in_send = None
        self.recvs = []
        self.recv_sges.clear()
        for wr in pending:
            self.qp.recv_cq.push(
                WorkCompletion(wr.wr_id, WcStatus.WR_FLUSH_ERR, WcOpcode.RECV, 0, self.qp.qpn)
            )
