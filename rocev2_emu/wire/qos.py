"""Traffic classes: the facts NICs and switches share about priorities, in one home below both.

IEEE 802.1Q has eight priorities (PCP 0-7), which 802.1Qbb PFC pauses one by one.  A RoCEv2
frame's priority comes from the DSCP of its IPv4 header: the fabric's map first (the common
RoCE deployment: DSCP 26 -> priority 3, the lossless class, and DSCP 48 -> priority 6 for
CNPs, as NVIDIA's RoCE configuration guides set them), else the DSCP's class selector (DSCP >> 3,
RFC 2474 §4.2.2.2).
"""

from __future__ import annotations

from typing import Final

PRIORITIES: Final = 8
DEFAULT_DSCP_MAP: Final = {26: 3, 48: 6}


def priority_of(dscp_map: dict[int, int], dscp: int) -> int:
    """The 802.1p priority of ``dscp``: the map's, else its class selector."""
    return dscp_map.get(dscp, dscp >> 3)
