"""The userspace switch: a sans-IO pipeline (forwarding with ECMP, an HPCC-style MMU with PFC
headroom, egress queues per port and priority, ECN, PFC, the PFC watchdog) and its trio driver.

It shares only the frame codecs (:mod:`rocev2_emu.ethernet`, :mod:`rocev2_emu.pfc`,
:mod:`rocev2_emu.crc`) with the host side.
"""
