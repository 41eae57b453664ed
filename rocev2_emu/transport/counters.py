"""Transport counters of one NIC, named after the mlx5 / rxe hardware counters users know.

Plain integer attributes on a slotted dataclass: the sans-IO core increments them, drivers
export them to Prometheus (:mod:`rocev2_emu.nic.metrics`).  Names follow
``/sys/class/infiniband/<dev>/ports/1/hw_counters`` (mlx5) and rxe's counters.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, fields


@dataclass(slots=True)
class NicCounters:
    # port counters (bytes are Ethernet frame bytes, without FCS)
    tx_packets: int = 0
    tx_bytes: int = 0
    rx_packets: int = 0
    rx_bytes: int = 0
    # requester side
    packet_seq_err: int = 0  # NAK-sequence-error received
    implied_nak_seq_err: int = 0  # READ/atomic response missing, detected from a later packet
    local_ack_timeout_err: int = 0  # local ACK timer expired
    retransmitted_packets: int = 0  # packets sent again (rxe "retry", mlx5 "roce_adp_retrans")
    rnr_nak_received: int = 0
    rnr_nak_retry_err: int = 0  # RNR retries exhausted
    retry_exceeded_err: int = 0  # transport retries exhausted
    req_remote_access_errors: int = 0
    req_remote_invalid_request: int = 0
    duplicate_response: int = 0  # ACK/response for PSNs already acknowledged
    ghost_response: int = 0  # response for PSNs never sent
    req_cqe_error: int = 0  # send completions with an error other than a flush
    req_cqe_flush_error: int = 0  # send completions flushed (the QP went to ERR)
    # responder side
    out_of_sequence: int = 0  # request packets with a PSN ahead of the expected one
    duplicate_request: int = 0
    out_of_buffer: int = 0  # RNR NAK sent: SEND with no posted receive
    resp_remote_access_errors: int = 0
    resp_invalid_request: int = 0
    resp_local_length_error: int = 0
    rx_write_requests: int = 0
    rx_read_requests: int = 0
    rx_atomic_requests: int = 0
    # congestion signals
    np_ecn_marked_roce_packets: int = 0  # RoCE packets received with CE
    np_cnp_sent: int = 0
    cnp_received: int = 0
    rp_cnp_handled: int = 0
    rp_cnp_ignored: int = 0  # CNPs for a QP that is gone or has no rate control
    # drops by reason: malformed (per MalformedFrame.reason), unknown_qp, qp_state, wrong_dst
    rx_drops: Counter[str] = field(default_factory=Counter)

    def as_dict(self) -> dict[str, int]:
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "rx_drops"}
