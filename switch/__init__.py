"""The userspace switch: a sans-IO pipeline (forwarding with ECMP, an HPCC-style MMU with PFC
headroom, egress queues per port and priority, ECN, PFC, the PFC watchdog), its driver on the
one pump loop, its metrics, and its process (:mod:`switch.node`).

It shares only the wire (:mod:`rocev2_emu.wire`: frame codecs, CRC, line-rate timing) and the
runtime (:mod:`rocev2_emu.runtime`: clock, ports, link faults, the pump, control framing,
node metrics) with the host side; ``lint-imports`` checks it.
"""

from rocev2_emu import cores as _cores  # first: compiled or pure, before any core loads

del _cores
