"""What a NIC core is told about itself and its link (:class:`NicConfig`): its address, its
line rate, its DSCP and ECN marking, the DSCP -> priority map (RoCE data on 3 and CNPs on 6 by
default, the usual lossless-fabric convention), its rate control, and whether it answers CE
marks with CNPs (the DCQCN notification point).  One per NIC.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rocev2_emu.cc import PROFILES, LineRateFactory, RateControlFactory
from rocev2_emu.nic.ingress import IngressConfig
from rocev2_emu.transport.qp import DEFAULT_MAX_INFLIGHT
from rocev2_emu.wire.ethernet import ECN_ECT0
from rocev2_emu.wire.qos import DEFAULT_DSCP_MAP
from rocev2_emu.wire.roce import DSCP_CNP, DSCP_ROCE


@dataclass(slots=True)
class NicConfig:
    """What a NIC needs to know about itself and its link."""

    ip: str  # emulated IPv4 address (the RoCEv2 GID)
    mac: bytes | None = None  # default 02:00:<ip>
    next_hop_mac: bytes | None = None  # a switch port's MAC; None: the peer NIC's (direct link)
    vni: int = 1
    link_bps: float = 100e9  # emulated line rate; 0 = unpaced
    dscp: int = DSCP_ROCE  # DSCP of QPs that set no traffic class of their own
    dscp_map: dict[int, int] = field(default_factory=lambda: dict(DEFAULT_DSCP_MAP))
    ecn: int = ECN_ECT0
    catchup: float = 0.0  # emulated seconds a late pump may send "in the past" to keep the rate
    ingress: IngressConfig | None = None  # a slow receiver that pauses its switch (PFC)
    rate_control: RateControlFactory = field(default_factory=LineRateFactory)  # every QP's
    send_cnps: bool = False  # notification point: answer CE marks with CNPs
    cnp_interval: float = PROFILES["paper"].cnp_interval  # at most one CNP per QP per interval
    cnp_dscp: int = DSCP_CNP
    max_inflight: int = DEFAULT_MAX_INFLIGHT  # per-QP cap on unacknowledged packets
    timing_only: bool = False  # payloads elided on the wire (FrameTemplate.build's elide)
