"""A posted send work request in its wire form: the opcodes and extension headers of each of its
packets, worked out once when it is posted (IBTA vol. 1 §9.2, §9.4), and its progress.

The requester (:mod:`rocev2_emu.transport.requester`) cuts packets from a :class:`SendWqe` with
a few comparisons; the tables here map a work request's kind to its packets' opcodes, a READ
response opcode to its position in the response, and a NAK code to the completion status.
"""

from __future__ import annotations

from typing import Final

from rocev2_emu.transport.work import SendFlags, SendWR, SgeList, WcStatus, WrOpcode
from rocev2_emu.wire.bth import NakCode, psn_add
from rocev2_emu.wire.bth import Opcode as Op
from rocev2_emu.wire.roce import pack_imm, pack_reth

_FENCE: Final = int(SendFlags.FENCE)
_SIGNALED: Final = int(SendFlags.SIGNALED)
_SOLICITED: Final = int(SendFlags.SOLICITED)

READ_OR_ATOMIC: Final = frozenset(
    {WrOpcode.RDMA_READ, WrOpcode.ATOMIC_CMP_AND_SWP, WrOpcode.ATOMIC_FETCH_AND_ADD}
)
NAK_STATUS: Final = {
    NakCode.INVALID_REQUEST: WcStatus.REM_INV_REQ_ERR,
    NakCode.REMOTE_ACCESS_ERROR: WcStatus.REM_ACCESS_ERR,
    NakCode.REMOTE_OPERATIONAL_ERROR: WcStatus.REM_OP_ERR,
    NakCode.INVALID_RD_REQUEST: WcStatus.REM_INV_RD_REQ_ERR,
}
# (is SEND, with immediate) -> opcodes of the (only, first, middle, last) packet of a message
DATA_OPS: Final = {
    (True, False): (Op.RC_SEND_ONLY, Op.RC_SEND_FIRST, Op.RC_SEND_MIDDLE, Op.RC_SEND_LAST),
    (True, True): (
        Op.RC_SEND_ONLY_WITH_IMMEDIATE,
        Op.RC_SEND_FIRST,
        Op.RC_SEND_MIDDLE,
        Op.RC_SEND_LAST_WITH_IMMEDIATE,
    ),
    (False, False): (
        Op.RC_RDMA_WRITE_ONLY,
        Op.RC_RDMA_WRITE_FIRST,
        Op.RC_RDMA_WRITE_MIDDLE,
        Op.RC_RDMA_WRITE_LAST,
    ),
    (False, True): (
        Op.RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE,
        Op.RC_RDMA_WRITE_FIRST,
        Op.RC_RDMA_WRITE_MIDDLE,
        Op.RC_RDMA_WRITE_LAST_WITH_IMMEDIATE,
    ),
}
READ_RESP_POSITION: Final = {
    Op.RC_RDMA_READ_RESPONSE_ONLY: (True, True),
    Op.RC_RDMA_READ_RESPONSE_FIRST: (True, False),
    Op.RC_RDMA_READ_RESPONSE_MIDDLE: (False, False),
    Op.RC_RDMA_READ_RESPONSE_LAST: (False, True),
}


class SendWqe:
    """A posted send work request and its progress.

    For SEND and WRITE the four opcodes and the extension headers of the message are worked
    out once here, so cutting a packet is a few comparisons."""

    __slots__ = (
        "fence",
        "first_ext",
        "first_psn",
        "kind",
        "last_ext",
        "length",
        "npkts",
        "ops",
        "rerequest_psn",
        "resp_pkts",
        "sges",
        "signaled",
        "solicited",
        "started",
        "wr",
    )

    def __init__(self, wr: SendWR, sges: SgeList, first_psn: int, mtu: int) -> None:
        self.wr = wr
        kind = self.kind = wr.opcode
        self.sges = sges
        self.length = sges.length
        self.first_psn = first_psn
        if kind in (WrOpcode.ATOMIC_CMP_AND_SWP, WrOpcode.ATOMIC_FETCH_AND_ADD):
            self.npkts = 1
        else:
            self.npkts = max(1, -(-self.length // mtu))
        self.resp_pkts = 0  # READ: response packets received in order
        self.rerequest_psn = -1
        self.started = False
        with_imm = kind in (WrOpcode.SEND_WITH_IMM, WrOpcode.RDMA_WRITE_WITH_IMM)
        self.ops = DATA_OPS[kind in (WrOpcode.SEND, WrOpcode.SEND_WITH_IMM), with_imm]
        is_write = kind in (WrOpcode.RDMA_WRITE, WrOpcode.RDMA_WRITE_WITH_IMM)
        self.first_ext = pack_reth(wr.remote_addr, wr.rkey, self.length) if is_write else b""
        self.last_ext = pack_imm(wr.imm_data or 0) if with_imm else b""
        # the flags as plain bools: an IntFlag's & runs enum.py's Python on every test
        flags = int(wr.send_flags)
        self.fence = bool(flags & _FENCE)
        self.signaled = bool(flags & _SIGNALED)
        self.solicited = bool(flags & _SOLICITED)

    @property
    def last_psn(self) -> int:
        return psn_add(self.first_psn, self.npkts - 1)
