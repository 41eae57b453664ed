"""Work requests, work completions and completion queues, shaped after libibverbs.

``SendWR`` / ``RecvWR`` / ``Sge`` mirror ``ibv_send_wr`` / ``ibv_recv_wr`` / ``ibv_sge``;
``WorkCompletion`` mirrors ``ibv_wc`` (wr_id, status, opcode, byte_len, imm_data, qp_num) and
the enums carry ibverbs' names and numeric codes (``ibv_wc_status``, ``ibv_wc_opcode``,
``ibv_wr_opcode``).  Also owns gather/scatter over SGE lists, used by the requester and the
responder to read and write registered memory without copying whole messages.
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Callable, Sequence
from typing import Final

from rocev2_emu.transport.errors import LocalVerbsError
from rocev2_emu.transport.memory import Access, MemoryRegion, MemoryTable, ProtectionDomain


class WrOpcode(enum.IntEnum):
    """ibv_wr_opcode."""

    RDMA_WRITE = 0
    RDMA_WRITE_WITH_IMM = 1
    SEND = 2
    SEND_WITH_IMM = 3
    RDMA_READ = 4
    ATOMIC_CMP_AND_SWP = 5
    ATOMIC_FETCH_AND_ADD = 6


class WcStatus(enum.IntEnum):
    """ibv_wc_status."""

    SUCCESS = 0
    LOC_LEN_ERR = 1
    LOC_QP_OP_ERR = 2
    LOC_EEC_OP_ERR = 3
    LOC_PROT_ERR = 4
    WR_FLUSH_ERR = 5
    MW_BIND_ERR = 6
    BAD_RESP_ERR = 7
    LOC_ACCESS_ERR = 8
    REM_INV_REQ_ERR = 9
    REM_ACCESS_ERR = 10
    REM_OP_ERR = 11
    RETRY_EXC_ERR = 12
    RNR_RETRY_EXC_ERR = 13
    LOC_RDD_VIOL_ERR = 14
    REM_INV_RD_REQ_ERR = 15
    REM_ABORT_ERR = 16
    INV_EECN_ERR = 17
    INV_EEC_STATE_ERR = 18
    FATAL_ERR = 19
    RESP_TIMEOUT_ERR = 20
    GENERAL_ERR = 21


class WcOpcode(enum.IntEnum):
    """ibv_wc_opcode."""

    SEND = 0
    RDMA_WRITE = 1
    RDMA_READ = 2
    COMP_SWAP = 3
    FETCH_ADD = 4
    RECV = 128
    RECV_RDMA_WITH_IMM = 129


class SendFlags(enum.IntFlag):
    """ibv_send_flags."""

    NONE = 0
    FENCE = 1
    SIGNALED = 2
    SOLICITED = 4
    INLINE = 8


WC_OPCODE_OF: Final[dict[WrOpcode, WcOpcode]] = {
    WrOpcode.RDMA_WRITE: WcOpcode.RDMA_WRITE,
    WrOpcode.RDMA_WRITE_WITH_IMM: WcOpcode.RDMA_WRITE,
    WrOpcode.SEND: WcOpcode.SEND,
    WrOpcode.SEND_WITH_IMM: WcOpcode.SEND,
    WrOpcode.RDMA_READ: WcOpcode.RDMA_READ,
    WrOpcode.ATOMIC_CMP_AND_SWP: WcOpcode.COMP_SWAP,
    WrOpcode.ATOMIC_FETCH_AND_ADD: WcOpcode.FETCH_ADD,
}


class Sge:
    """ibv_sge: a piece of a registered buffer.  (A plain class, native when compiled, as the
    other records a frame or a completion makes: a NamedTuple is built through an interpreted
    __new__ even in compiled code.)"""

    __slots__ = ("addr", "length", "lkey")

    def __init__(self, addr: int, length: int, lkey: int) -> None:
        self.addr, self.length, self.lkey = addr, length, lkey

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sge):
            return NotImplemented
        return (self.addr, self.length, self.lkey) == (other.addr, other.length, other.lkey)

    def __repr__(self) -> str:
        return f"Sge(addr=0x{self.addr:x}, length={self.length}, lkey=0x{self.lkey:x})"


class SendWR:
    """ibv_send_wr (RC subset).  (A plain class, native when compiled, as :class:`Sge`: a
    dataclass's ``__init__`` is generated interpreted code, run at every post even from
    compiled code.)"""

    __slots__ = (
        "compare_add",
        "imm_data",
        "opcode",
        "remote_addr",
        "rkey",
        "send_flags",
        "sg_list",
        "swap",
        "wr_id",
    )

    def __init__(
        self,
        wr_id: int,
        opcode: WrOpcode,
        sg_list: list[Sge] | None = None,
        send_flags: SendFlags = SendFlags.SIGNALED,
        imm_data: int | None = None,
        remote_addr: int = 0,
        rkey: int = 0,
        compare_add: int = 0,
        swap: int = 0,
    ) -> None:
        self.wr_id = wr_id
        self.opcode = opcode
        self.sg_list: list[Sge] = [] if sg_list is None else sg_list
        self.send_flags = send_flags
        self.imm_data = imm_data
        self.remote_addr = remote_addr
        self.rkey = rkey
        self.compare_add = compare_add
        self.swap = swap

    def _fields(self) -> tuple[object, ...]:
        return (
            self.wr_id,
            self.opcode,
            self.sg_list,
            self.send_flags,
            self.imm_data,
            self.remote_addr,
            self.rkey,
            self.compare_add,
            self.swap,
        )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, SendWR):
            return NotImplemented
        return self._fields() == other._fields()

    def __repr__(self) -> str:
        return (
            f"SendWR(wr_id={self.wr_id!r}, opcode={self.opcode!r}, sg_list={self.sg_list!r}, "
            f"send_flags={self.send_flags!r}, imm_data={self.imm_data!r}, "
            f"remote_addr={self.remote_addr!r}, rkey={self.rkey!r}, "
            f"compare_add={self.compare_add!r}, swap={self.swap!r})"
        )


class RecvWR:
    """ibv_recv_wr (a plain class, as :class:`SendWR`).  Without ``sg_list`` (a WRITE with
    immediate's receive, which lands no bytes) it shares one empty list: an all-to-all posts
    thousands a rank."""

    __slots__ = ("sg_list", "wr_id")

    def __init__(self, wr_id: int, sg_list: Sequence[Sge] = ()) -> None:
        self.wr_id = wr_id
        self.sg_list = sg_list

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, RecvWR):
            return NotImplemented
        return (self.wr_id, self.sg_list) == (other.wr_id, other.sg_list)

    def __repr__(self) -> str:
        return f"RecvWR(wr_id={self.wr_id!r}, sg_list={self.sg_list!r})"


class WorkCompletion:
    """ibv_wc (a plain class, as :class:`Sge`)."""

    __slots__ = (
        "byte_len",
        "imm_data",
        "opcode",
        "qp_num",
        "src_qp",
        "status",
        "vendor_err",
        "wr_id",
    )

    def __init__(
        self,
        wr_id: int,
        status: WcStatus,
        opcode: WcOpcode,
        byte_len: int,
        qp_num: int,
        imm_data: int | None = None,
        src_qp: int = 0,
        vendor_err: int = 0,
    ) -> None:
        self.wr_id = wr_id
        self.status = status
        self.opcode = opcode
        self.byte_len = byte_len
        self.qp_num = qp_num
        self.imm_data = imm_data
        self.src_qp = src_qp
        self.vendor_err = vendor_err

    def _values(self) -> tuple[object, ...]:
        return (
            self.wr_id,
            self.status,
            self.opcode,
            self.byte_len,
            self.qp_num,
            self.imm_data,
            self.src_qp,
            self.vendor_err,
        )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, WorkCompletion):
            return NotImplemented
        return self._values() == other._values()

    def __repr__(self) -> str:
        return (
            f"WorkCompletion(wr_id={self.wr_id}, status={self.status!r}, opcode={self.opcode!r}, "
            f"byte_len={self.byte_len}, qp_num=0x{self.qp_num:06x}, imm_data={self.imm_data})"
        )


class CompletionQueue:
    """A completion queue: completions wait here until polled; overrun is an error, not a loss."""

    def __init__(
        self,
        handle: int,
        depth: int,
        on_push: Callable[[CompletionQueue], None] | None = None,
    ) -> None:
        """``on_push``: told of each new entry (the NIC notes which queues grew, so its driver
        wakes only their waiters)."""
        if depth < 1:
            raise LocalVerbsError(f"CQ depth {depth} < 1")
        self.handle = handle
        self.depth = depth
        self.entries: deque[WorkCompletion] = deque()
        self.overrun = False
        self.pushed = 0  # monotonic count
        self.on_push = on_push

    def push(self, wc: WorkCompletion) -> None:
        if len(self.entries) >= self.depth:
            self.overrun = True
        self.entries.append(wc)
        self.pushed += 1
        if self.on_push is not None:
            self.on_push(self)

    def poll(self, max_entries: int) -> list[WorkCompletion]:
        if self.overrun:
            raise LocalVerbsError(f"CQ {self.handle} overran its depth {self.depth}")
        n = min(max_entries, len(self.entries))
        return [self.entries.popleft() for _ in range(n)]


class SgeList:
    """A validated SGE list: gather and scatter at byte offsets of the message."""

    __slots__ = ("length", "pieces")

    def __init__(self, pieces: list[memoryview]) -> None:
        self.pieces = pieces
        self.length = sum(len(p) for p in pieces)

    @classmethod
    def resolve(
        cls, sges: Sequence[Sge], mrs: MemoryTable, pd: ProtectionDomain, need: Access
    ) -> SgeList:
        """Check every SGE against its MR (lkey, PD, bounds, access) and map it; no SGE is
        the one shared empty list (it is never changed)."""
        if not sges:
            return EMPTY_SGES
        pieces = []
        for i, sge in enumerate(sges):
            mr: MemoryRegion | None = mrs.by_lkey(sge.lkey)
            if mr is None:
                raise LocalVerbsError(f"sg_list[{i}]: lkey 0x{sge.lkey:x} names no memory region")
            if mr.pd is not pd:
                raise LocalVerbsError(f"sg_list[{i}]: MR {mr.lkey:#x} is in another PD")
            if sge.length < 0 or not mr.contains(sge.addr, sge.length):
                raise LocalVerbsError(
                    f"sg_list[{i}]: [0x{sge.addr:x}, +{sge.length}) is outside MR "
                    f"[0x{mr.addr:x}, +{mr.length})"
                )
            if need and not mr.access & need:
                raise LocalVerbsError(f"sg_list[{i}]: MR lacks {need!r} (has {mr.access!r})")
            pieces.append(mr.view(sge.addr, sge.length))
        return cls(pieces)

    def gather(self, offset: int, length: int) -> memoryview | bytes:
        """``length`` bytes of the message starting at ``offset`` (zero-copy when one piece)."""
        if len(self.pieces) == 1:
            return self.pieces[0][offset : offset + length]
        out = bytearray()
        for piece in self.pieces:
            n = len(piece)
            if offset < n and length:
                chunk = piece[offset : offset + length]
                out += chunk
                length -= len(chunk)
            offset = max(0, offset - n)
        return bytes(out)

    def scatter(self, offset: int, data: bytes | bytearray | memoryview) -> None:
        """Write ``data`` at message ``offset``; the caller has checked it fits."""
        pos = 0
        for piece in self.pieces:
            n = len(piece)
            if offset < n and pos < len(data):
                take = min(n - offset, len(data) - pos)
                piece[offset : offset + take] = data[pos : pos + take]
                pos += take
            offset = max(0, offset - n)


EMPTY_SGES: Final = SgeList([])  # every SGE list without entries resolves to this one
