"""Rate control of RoCE queue pairs behind a small interface, with a registry by name.

:class:`RateControl` is what the NIC's egress asks (``rate``, ``next_send_time``) and tells
(``on_sent``, ``on_cnp``, ``handle_timer``); :data:`REGISTRY` maps the names a topology file
uses (``"dcqcn"``, ``"static"``, ``"none"``) to implementations, as aioquic's congestion
package does.
"""

from __future__ import annotations

from rocev2_emu.cc.base import REGISTRY, LineRate, RateControl, create
from rocev2_emu.cc.dcqcn import PROFILES, Dcqcn, DcqcnParams

__all__ = ["PROFILES", "REGISTRY", "Dcqcn", "DcqcnParams", "LineRate", "RateControl", "create"]
