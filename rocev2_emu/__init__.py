"""rocev2-emu: a RoCEv2 fabric that really runs.

Software NICs speak the real RoCEv2 wire format (Ethernet / IPv4 / UDP 4791 / BTH / ... / ICRC)
carried between processes as VXLAN datagrams; the reliable-connected transport, rate control and
switch pipeline are sans-IO cores driven by thin trio shells.  See ``docs/`` and DESIGN.md.
"""

from rocev2_emu import cores as _cores  # first: decides compiled or pure before any core loads

__version__ = "0.1.0"
__all__ = ["__version__"]
del _cores
