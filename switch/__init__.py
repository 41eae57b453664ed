"""The userspace switch: a sans-IO pipeline (forwarding with ECMP, an HPCC-style MMU with PFC
headroom, egress queues per port and priority, ECN, PFC, the PFC watchdog) and its trio driver.

It shares only the frame codecs (:mod:`rocev2_emu.wire.ethernet`, :mod:`rocev2_emu.wire.pfc`,
:mod:`rocev2_emu.wire.crc`) with the host side.
"""
