"""The userspace switch (egress queues, shared buffer, ECN, PFC, ECMP) - not built yet.

This package is reserved by the project layout; the fabric issue fills it.  It will share only
the frame codecs (:mod:`rocev2_emu.roce`, :mod:`rocev2_emu.pfc`) with the host side.
"""
