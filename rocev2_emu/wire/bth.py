"""InfiniBand transport headers carried by RoCEv2: BTH and its extension headers.

Layouts follow the IBTA specification vol. 1, ch. 9.2-9.5 (BTH §9.2, RETH §9.3.3, AETH §9.3.5,
ImmDt §9.3.6, AtomicETH §9.3.4, AtomicAckETH §9.5.3, DETH §9.3.2) and RoCEv2 Annex A17 (CNP,
opcode 0x81).  Field names are the spec's and scapy's (``scapy.contrib.roce``).  The table
:data:`OPCODE_LAYOUT` says which extension headers follow the BTH for every opcode we accept.
"""

from __future__ import annotations

import enum
import struct
from typing import Final


class Opcode(enum.IntEnum):
    """BTH opcodes: transport (bits 7-5: RC 000, UC 001, UD 011) plus operation (bits 4-0)."""

    RC_SEND_FIRST = 0x00
    RC_SEND_MIDDLE = 0x01
    RC_SEND_LAST = 0x02
    RC_SEND_LAST_WITH_IMMEDIATE = 0x03
    RC_SEND_ONLY = 0x04
    RC_SEND_ONLY_WITH_IMMEDIATE = 0x05
    RC_RDMA_WRITE_FIRST = 0x06
    RC_RDMA_WRITE_MIDDLE = 0x07
    RC_RDMA_WRITE_LAST = 0x08
    RC_RDMA_WRITE_LAST_WITH_IMMEDIATE = 0x09
    RC_RDMA_WRITE_ONLY = 0x0A
    RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE = 0x0B
    RC_RDMA_READ_REQUEST = 0x0C
    RC_RDMA_READ_RESPONSE_FIRST = 0x0D
    RC_RDMA_READ_RESPONSE_MIDDLE = 0x0E
    RC_RDMA_READ_RESPONSE_LAST = 0x0F
    RC_RDMA_READ_RESPONSE_ONLY = 0x10
    RC_ACKNOWLEDGE = 0x11
    RC_ATOMIC_ACKNOWLEDGE = 0x12
    RC_COMPARE_SWAP = 0x13
    RC_FETCH_ADD = 0x14
    UC_SEND_FIRST = 0x20
    UC_SEND_MIDDLE = 0x21
    UC_SEND_LAST = 0x22
    UC_SEND_LAST_WITH_IMMEDIATE = 0x23
    UC_SEND_ONLY = 0x24
    UC_SEND_ONLY_WITH_IMMEDIATE = 0x25
    UC_RDMA_WRITE_FIRST = 0x26
    UC_RDMA_WRITE_MIDDLE = 0x27
    UC_RDMA_WRITE_LAST = 0x28
    UC_RDMA_WRITE_LAST_WITH_IMMEDIATE = 0x29
    UC_RDMA_WRITE_ONLY = 0x2A
    UC_RDMA_WRITE_ONLY_WITH_IMMEDIATE = 0x2B
    UD_SEND_ONLY = 0x64
    UD_SEND_ONLY_WITH_IMMEDIATE = 0x65
    CNP = 0x81


class Ext(enum.IntFlag):
    """Extension headers that may follow a BTH, in wire order."""

    NONE = 0
    DETH = 1
    RETH = 2
    ATOMIC_ETH = 4
    AETH = 8
    ATOMIC_ACK_ETH = 16
    IMM = 32
    CNP_PAD = 64


_O = Opcode
OPCODE_LAYOUT: Final[dict[int, Ext]] = {
    _O.RC_SEND_FIRST: Ext.NONE,
    _O.RC_SEND_MIDDLE: Ext.NONE,
    _O.RC_SEND_LAST: Ext.NONE,
    _O.RC_SEND_LAST_WITH_IMMEDIATE: Ext.IMM,
    _O.RC_SEND_ONLY: Ext.NONE,
    _O.RC_SEND_ONLY_WITH_IMMEDIATE: Ext.IMM,
    _O.RC_RDMA_WRITE_FIRST: Ext.RETH,
    _O.RC_RDMA_WRITE_MIDDLE: Ext.NONE,
    _O.RC_RDMA_WRITE_LAST: Ext.NONE,
    _O.RC_RDMA_WRITE_LAST_WITH_IMMEDIATE: Ext.IMM,
    _O.RC_RDMA_WRITE_ONLY: Ext.RETH,
    _O.RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE: Ext.RETH | Ext.IMM,
    _O.RC_RDMA_READ_REQUEST: Ext.RETH,
    _O.RC_RDMA_READ_RESPONSE_FIRST: Ext.AETH,
    _O.RC_RDMA_READ_RESPONSE_MIDDLE: Ext.NONE,
    _O.RC_RDMA_READ_RESPONSE_LAST: Ext.AETH,
    _O.RC_RDMA_READ_RESPONSE_ONLY: Ext.AETH,
    _O.RC_ACKNOWLEDGE: Ext.AETH,
    _O.RC_ATOMIC_ACKNOWLEDGE: Ext.AETH | Ext.ATOMIC_ACK_ETH,
    _O.RC_COMPARE_SWAP: Ext.ATOMIC_ETH,
    _O.RC_FETCH_ADD: Ext.ATOMIC_ETH,
    _O.UC_SEND_FIRST: Ext.NONE,
    _O.UC_SEND_MIDDLE: Ext.NONE,
    _O.UC_SEND_LAST: Ext.NONE,
    _O.UC_SEND_LAST_WITH_IMMEDIATE: Ext.IMM,
    _O.UC_SEND_ONLY: Ext.NONE,
    _O.UC_SEND_ONLY_WITH_IMMEDIATE: Ext.IMM,
    _O.UC_RDMA_WRITE_FIRST: Ext.RETH,
    _O.UC_RDMA_WRITE_MIDDLE: Ext.NONE,
    _O.UC_RDMA_WRITE_LAST: Ext.NONE,
    _O.UC_RDMA_WRITE_LAST_WITH_IMMEDIATE: Ext.IMM,
    _O.UC_RDMA_WRITE_ONLY: Ext.RETH,
    _O.UC_RDMA_WRITE_ONLY_WITH_IMMEDIATE: Ext.RETH | Ext.IMM,
    _O.UD_SEND_ONLY: Ext.DETH,
    _O.UD_SEND_ONLY_WITH_IMMEDIATE: Ext.DETH | Ext.IMM,
    _O.CNP: Ext.CNP_PAD,
}

# BTH, IBTA §9.2:
#   opcode(8) | SE(1) M(1) PadCnt(2) TVer(4) | P_Key(16)
#   | FECN(1) BECN(1) resv6(6) DestQP(24) | AckReq(1) resv7(7) PSN(24)
BTH: Final = struct.Struct("!BBHII")
BTH_LEN: Final = 12
# RETH, §9.3.3: VA(64) | R_Key(32) | DMA length(32)
RETH: Final = struct.Struct("!QII")
RETH_LEN: Final = 16
# AETH, §9.3.5: syndrome(8) | MSN(24)
AETH: Final = struct.Struct("!I")
AETH_LEN: Final = 4
# ImmDt, §9.3.6: immediate data(32), carried as opaque big-endian bytes
IMM: Final = struct.Struct("!I")
IMM_LEN: Final = 4
# AtomicETH, §9.3.4: VA(64) | R_Key(32) | swap or add data(64) | compare data(64)
ATOMIC_ETH: Final = struct.Struct("!QIQQ")
ATOMIC_ETH_LEN: Final = 28
# AtomicAckETH, §9.5.3: original remote data(64)
ATOMIC_ACK_ETH: Final = struct.Struct("!Q")
ATOMIC_ACK_ETH_LEN: Final = 8
# DETH, §9.3.2: Q_Key(32) | reserved(8) | source QP(24)
DETH: Final = struct.Struct("!II")
DETH_LEN: Final = 8
# CNP, Annex A17.9.2: 16 reserved bytes after the BTH
CNP_PAD_LEN: Final = 16
ICRC_LEN: Final = 4

EXT_LEN: Final[dict[Ext, int]] = {
    Ext.DETH: DETH_LEN,
    Ext.RETH: RETH_LEN,
    Ext.ATOMIC_ETH: ATOMIC_ETH_LEN,
    Ext.AETH: AETH_LEN,
    Ext.ATOMIC_ACK_ETH: ATOMIC_ACK_ETH_LEN,
    Ext.IMM: IMM_LEN,
    Ext.CNP_PAD: CNP_PAD_LEN,
}
# Total extension-header bytes after the BTH, per opcode.
OPCODE_EXT_LEN: Final[dict[int, int]] = {
    op: sum(n for flag, n in EXT_LEN.items() if layout & flag)
    for op, layout in OPCODE_LAYOUT.items()
}

DEFAULT_PKEY: Final = 0xFFFF
PSN_MASK: Final = 0xFFFFFF
QPN_MASK: Final = 0xFFFFFF

# AETH syndrome, IBTA §9.7.5.1 / table 43: bits 6-5 select ACK / RNR NAK / NAK, bits 4-0 are
# the credit count, the RNR timer code, or the NAK code.
AETH_ACK: Final = 0b000 << 5
AETH_RNR_NAK: Final = 0b001 << 5
AETH_NAK: Final = 0b011 << 5
AETH_KIND_MASK: Final = 0b011 << 5
AETH_VALUE_MASK: Final = 0x1F
AETH_CREDITS_INVALID: Final = 0x1F  # "end-to-end flow control not in use"


class NakCode(enum.IntEnum):
    """NAK codes in the AETH low five bits (IBTA table 43)."""

    PSN_SEQUENCE_ERROR = 0
    INVALID_REQUEST = 1
    REMOTE_ACCESS_ERROR = 2
    REMOTE_OPERATIONAL_ERROR = 3
    INVALID_RD_REQUEST = 4


# The extended headers a decoded frame carries: plain classes, native ones when compiled (a
# NamedTuple is built through an interpreted __new__ even in compiled code).


class Reth:
    """RDMA extended transport header (IBTA 9.3.3)."""

    __slots__ = ("dma_len", "rkey", "va")

    def __init__(self, va: int, rkey: int, dma_len: int) -> None:
        self.va, self.rkey, self.dma_len = va, rkey, dma_len

    def __repr__(self) -> str:
        return f"Reth(va=0x{self.va:x}, rkey=0x{self.rkey:x}, dma_len={self.dma_len})"


class Aeth:
    """ACK extended transport header (IBTA 9.3.5)."""

    __slots__ = ("msn", "syndrome")

    def __init__(self, syndrome: int, msn: int) -> None:
        self.syndrome, self.msn = syndrome, msn

    def __repr__(self) -> str:
        return f"Aeth(syndrome=0x{self.syndrome:02x}, msn={self.msn})"


class AtomicEth:
    """Atomic extended transport header (IBTA 9.3.7)."""

    __slots__ = ("compare", "rkey", "swap_add", "va")

    def __init__(self, va: int, rkey: int, swap_add: int, compare: int) -> None:
        self.va, self.rkey, self.swap_add, self.compare = va, rkey, swap_add, compare

    def __repr__(self) -> str:
        return f"AtomicEth(va=0x{self.va:x}, rkey=0x{self.rkey:x}, swap_add={self.swap_add})"


class Deth:
    """Datagram extended transport header (IBTA 9.3.2)."""

    __slots__ = ("qkey", "src_qp")

    def __init__(self, qkey: int, src_qp: int) -> None:
        self.qkey, self.src_qp = qkey, src_qp

    def __repr__(self) -> str:
        return f"Deth(qkey=0x{self.qkey:x}, src_qp=0x{self.src_qp:06x})"


def psn_add(psn: int, n: int) -> int:
    return (psn + n) & PSN_MASK


def psn_diff(a: int, b: int) -> int:
    """Signed distance a - b in 24-bit PSN space, in [-2**23, 2**23)."""
    d = (a - b) & PSN_MASK
    return d - (1 << 24) if d >= 1 << 23 else d
