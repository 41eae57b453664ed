"""Rate control of RoCE queue pairs behind a small interface, and the factories a NIC is
configured with.

:class:`RateControl` is what the NIC's egress asks (``rate``, ``next_send_time``) and tells
(``on_sent``, ``on_cnp``, ``handle_timer``), as aioquic's congestion package does; a NIC holds
one :class:`RateControlFactory` (:class:`LineRateFactory`, :class:`StaticRateFactory` for NIC
pacing, :class:`DcqcnFactory`), resolved once from its configuration, which makes each QP's.
"""

from __future__ import annotations

from rocev2_emu.cc.base import (
    LineRate,
    LineRateFactory,
    RateControl,
    RateControlFactory,
    StaticRate,
    StaticRateFactory,
)
from rocev2_emu.cc.dcqcn import PROFILES, Dcqcn, DcqcnFactory, DcqcnParams

__all__ = [
    "PROFILES",
    "Dcqcn",
    "DcqcnFactory",
    "DcqcnParams",
    "LineRate",
    "LineRateFactory",
    "RateControl",
    "RateControlFactory",
    "StaticRate",
    "StaticRateFactory",
]
