"""What the requester and the responder share and what they see of their queue pair.

:class:`OutPacket` is a transport packet for the NIC to frame.  :class:`QPEndpoint` is the part
of a :class:`~rocev2_emu.transport.qp.QueuePair` its two halves read and call (attributes set by
``ibv_modify_qp``, its memory, counters and completion queues, and ``fail``): a base class of
the QP, so the halves never import the QP that owns them and the package has no import circle.
"""

from __future__ import annotations

from rocev2_emu.transport.counters import NicCounters
from rocev2_emu.transport.memory import Access, MemoryTable, ProtectionDomain
from rocev2_emu.transport.work import CompletionQueue, WcStatus


class OutPacket:
    """A transport packet for the NIC to frame: BTH fields, extension headers, payload."""

    def __init__(
        self,
        opcode: int,
        psn: int,
        ackreq: bool,
        solicited: bool,
        ext: bytes,
        payload: bytes | memoryview,
    ) -> None:
        self.opcode = opcode
        self.psn = psn
        self.ackreq = ackreq
        self.solicited = solicited
        self.ext = ext
        self.payload = payload

    def __repr__(self) -> str:
        return (
            f"OutPacket(opcode={self.opcode}, psn={self.psn}, ackreq={self.ackreq}, "
            f"solicited={self.solicited}, ext={self.ext!r}, payload=<{len(self.payload)} B>)"
        )


class QPEndpoint:
    """The queue pair as its requester and responder see it: a base class that
    :class:`~rocev2_emu.transport.qp.QueuePair` inherits and sets up (not a Protocol, so that
    the compiled halves read these attributes as native fields)."""

    qpn: int
    pd: ProtectionDomain
    mrs: MemoryTable
    counters: NicCounters
    send_cq: CompletionQueue
    recv_cq: CompletionQueue
    sq_sig_all: bool
    access: Access
    mtu: int
    timeout: int
    retry_cnt: int
    rnr_retry: int
    max_rd_atomic: int
    max_dest_rd_atomic: int
    min_rnr_timer: int
    max_inflight: int
    last_error: str
    timing_only: bool  # payloads are elided on the wire: nothing to store or read

    def fail(self, head_status: WcStatus | None) -> None:
        raise NotImplementedError

    def in_error(self) -> bool:
        raise NotImplementedError

    def may_start_new_requests(self) -> bool:
        raise NotImplementedError
