"""What a switch is told about itself: its ports, its routes, its buffer, PFC, ECN, watchdog.

Every time and rate is emulated.  ECN defaults scale with the port's speed as the ns-3 HPCC
simulator's configuration does (Kmin 100 KB and Kmax 400 KB at 25 Gbit/s, i.e. 4 KB and 16 KB
per Gbit/s, Pmax 0.2); the PFC watchdog defaults are SONiC pfcwd's (200 ms detection, 200 ms
restoration, action drop).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final

from rocev2_emu.wire.linerate import NOMINAL_BPS
from rocev2_emu.wire.qos import DEFAULT_DSCP_MAP, priority_of
from switch.mmu import MmuConfig

# how a switch picks among equal-cost ports: the 5-tuple (RFC 2992 ECMP); the 5-tuple and the
# BTH destination QP (Meta's E-ECMP, a switch UDF on the RoCE header); or by destination alone
# (path pinning: every flow to one host takes one path)
ECMP_MODES: Final = ("5-tuple", "5-tuple+qpn", "destination")
# the same modes as the pipeline holds them (their index above); named Final ints rather than an
# IntEnum so that mypyc compiles a comparison to an integer compare, not an attribute load
ECMP_FIVE_TUPLE: Final = 0
ECMP_FIVE_TUPLE_QPN: Final = 1
ECMP_DESTINATION: Final = 2


@dataclass(slots=True, frozen=True)
class EcnThresholds:
    kmin_bytes: int
    kmax_bytes: int
    pmax: float

    @classmethod
    def for_rate(cls, rate_bps: float) -> EcnThresholds:
        gbps = rate_bps / 1e9
        return cls(int(4000 * gbps), int(16000 * gbps), 0.2)


@dataclass(slots=True)
class PortConfig:
    index: int
    vni: int  # names the link (RFC 7348 VNI)
    rate_bps: float  # emulated line rate; 0 = unpaced
    mac: bytes  # this port's MAC
    peer_mac: bytes  # the neighbour's MAC (destination MAC of frames sent out of this port)
    peer_name: str = ""
    ecn: EcnThresholds | None = None  # None: scaled to the port's rate
    headroom_bytes: int = 0  # PFC headroom its link needs (switch.mmu.pfc_headroom); 0: the MMU's


@dataclass(slots=True)
class SwitchConfig:
    name: str
    ports: list[PortConfig]
    # destination IPv4 -> equal-cost egress ports, where not ``default_route``
    routes: dict[int, tuple[int, ...]]
    mmu: MmuConfig = field(default_factory=MmuConfig)
    pfc_enabled: bool = True
    lossless: frozenset[int] = frozenset({3})
    pfc_quanta: int = 0xFFFF
    dscp_map: dict[int, int] = field(default_factory=lambda: dict(DEFAULT_DSCP_MAP))
    ecn_enabled: bool = True
    ecn_priorities: frozenset[int] = frozenset({3})
    watchdog_detect: float = 0.200
    watchdog_restore: float = 0.200
    watchdog_action: str = "drop"  # or "forward"
    seed: int = 0
    ecmp: str = "5-tuple"  # one of ECMP_MODES
    timing_only: bool = False  # frames carry their headers only (a timing-only run)
    # the ports of every host of ``hosts`` not in ``routes`` (a rack switch's uplinks): the
    # table grows with the exceptions, not with the fabric (rocev2_emu.topology.routes)
    default_route: tuple[int, ...] = ()
    hosts: frozenset[int] = frozenset()

    def priority_of(self, dscp: int) -> int:
        return priority_of(self.dscp_map, dscp)

    def ecn_of_ports(self) -> list[EcnThresholds]:
        """Each port's ECN thresholds: its own, or the default for its line rate (one object
        per rate, shared: they are frozen)."""
        by_rate: dict[float, EcnThresholds] = {}
        out: list[EcnThresholds] = []
        for p in self.ports:
            rate = p.rate_bps or NOMINAL_BPS
            ecn = p.ecn or by_rate.get(rate)
            if ecn is None:
                ecn = by_rate[rate] = EcnThresholds.for_rate(rate)
            out.append(ecn)
        return out
