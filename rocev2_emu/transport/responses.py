"""What the RC responder keeps between packets: the opcode classes it dispatches on, the
responses waiting in its FIFO (ACKs and NAKs, atomic ACKs, READ responses cut from memory as
the NIC asks), and the READ and atomic resources it remembers so that a duplicate is answered,
never executed twice (IBTA vol. 1 §9.7.5.1, §9.4.5).
"""

from __future__ import annotations

from typing import Final

from rocev2_emu.transport.memory import MemoryRegion
from rocev2_emu.wire.bth import Opcode as Op

SEND_FIRST_OPS: Final = frozenset(
    {Op.RC_SEND_FIRST, Op.RC_SEND_ONLY, Op.RC_SEND_ONLY_WITH_IMMEDIATE}
)
SEND_MORE_OPS: Final = frozenset(
    {Op.RC_SEND_MIDDLE, Op.RC_SEND_LAST, Op.RC_SEND_LAST_WITH_IMMEDIATE}
)
WRITE_FIRST_OPS: Final = frozenset(
    {Op.RC_RDMA_WRITE_FIRST, Op.RC_RDMA_WRITE_ONLY, Op.RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE}
)
WRITE_MORE_OPS: Final = frozenset(
    {Op.RC_RDMA_WRITE_MIDDLE, Op.RC_RDMA_WRITE_LAST, Op.RC_RDMA_WRITE_LAST_WITH_IMMEDIATE}
)
MORE_OPS: Final = SEND_MORE_OPS | WRITE_MORE_OPS  # the middles and lasts of a message
LAST_OPS: Final = frozenset(
    {
        Op.RC_SEND_LAST,
        Op.RC_SEND_LAST_WITH_IMMEDIATE,
        Op.RC_SEND_ONLY,
        Op.RC_SEND_ONLY_WITH_IMMEDIATE,
        Op.RC_RDMA_WRITE_LAST,
        Op.RC_RDMA_WRITE_LAST_WITH_IMMEDIATE,
        Op.RC_RDMA_WRITE_ONLY,
        Op.RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE,
    }
)
FIRST_OPS: Final = frozenset(
    {
        Op.RC_SEND_FIRST,
        Op.RC_SEND_ONLY,
        Op.RC_SEND_ONLY_WITH_IMMEDIATE,
        Op.RC_RDMA_WRITE_FIRST,
        Op.RC_RDMA_WRITE_ONLY,
        Op.RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE,
    }
)
ATOMIC_OPS: Final = frozenset({Op.RC_COMPARE_SWAP, Op.RC_FETCH_ADD})
U64: Final = (1 << 64) - 1


class ReadResponse:
    """A READ being answered: packets are cut from memory as the NIC asks for them."""

    __slots__ = ("first_psn", "length", "mr", "next_pkt", "npkts", "va")

    def __init__(
        self, mr: MemoryRegion | None, va: int, length: int, first_psn: int, mtu: int
    ) -> None:
        self.mr, self.va, self.length, self.first_psn = mr, va, length, first_psn
        self.npkts = max(1, -(-length // mtu))
        self.next_pkt = 0


class Resource:
    """A remembered READ (PSN range) or atomic (PSN and original value)."""

    __slots__ = ("first_psn", "npkts", "orig")

    def __init__(self, first_psn: int, npkts: int, orig: int | None) -> None:
        self.first_psn, self.npkts, self.orig = first_psn, npkts, orig


class Ack:
    """An ACK or NAK waiting in the response FIFO (a plain class: a NamedTuple is built through
    an interpreted __new__ in compiled code)."""

    __slots__ = ("first_psn", "msn", "syndrome")

    def __init__(self, first_psn: int, syndrome: int, msn: int) -> None:
        self.first_psn, self.syndrome, self.msn = first_psn, syndrome, msn

    def __repr__(self) -> str:
        return f"Ack(first_psn={self.first_psn}, syndrome=0x{self.syndrome:02x}, msn={self.msn})"


class AtomicAck:
    """An atomic's response waiting in the response FIFO: the original value."""

    __slots__ = ("first_psn", "msn", "orig")

    def __init__(self, first_psn: int, orig: int, msn: int) -> None:
        self.first_psn, self.orig, self.msn = first_psn, orig, msn

    def __repr__(self) -> str:
        return f"AtomicAck(first_psn={self.first_psn}, orig={self.orig}, msn={self.msn})"


class AccessDenied(Exception):
    """Raised inside the responder after a remote-access NAK has been queued."""


ResponseItem = Ack | AtomicAck | ReadResponse
