"""What a frame gets on its way through a switch (sans-IO): the forwarding decision - for an
IPv4 header the pipeline has validated, the header it leaves with, its priority and its egress
port among the equal-cost ones - and, when it leaves, its queue's ECN mark.

The TTL is decremented and the checksum fixed incrementally (RFC 1624); the priority is the
DSCP's; the egress port among several is sticky per flow, by a seeded hash of the 5-tuple (so
RoCE's per-QP UDP source port spreads QPs: ECMP, RFC 2992), of the 5-tuple and the BTH
destination QP (E-ECMP), or pinned by the destination address.
"""

from __future__ import annotations

import random
from typing import Final

from rocev2_emu.wire.crc import crc32
from rocev2_emu.wire.ethernet import ECN_CE, checksum_update
from switch.config import ECMP_DESTINATION, ECMP_FIVE_TUPLE_QPN, ECMP_MODES, SwitchConfig
from switch.port_state import PortState

IP: Final = 22  # IPv4 header offset inside a VXLAN datagram
# Validated IPv4 headers a switch remembers (one per flow, direction and frame length; about
# 200 bytes an entry, some 3 MB at the bound) before it forgets them all and learns again:
# above the several thousand a core switch sees in a thousand-flow incast.
VALID_IP_MAX: Final = 16384
# Flows whose ECMP port a switch remembers before it forgets them all and hashes again.
FLOWS_MAX: Final = 65536


class Forwarding:
    """The routes of one switch (``config.routes`` and its default route) as decisions per
    header.  Holds two memos, each emptied when it passes its bound: the validated headers'
    decisions (at most :data:`VALID_IP_MAX`) and the flows' ECMP ports (at most
    :data:`FLOWS_MAX`); both are forgotten when routes or links change."""

    def __init__(self, config: SwitchConfig, ports: list[PortState]) -> None:
        if config.ecmp not in ECMP_MODES:
            raise ValueError(f"switch {config.name}: ecmp {config.ecmp!r}: one of {ECMP_MODES}")
        self.config = config
        self.ports = ports  # the switch's: whether each is up
        self._mode = ECMP_MODES.index(config.ecmp)
        self._salt = config.seed & 0xFFFFFFFF
        self._prio = [config.priority_of(dscp) for dscp in range(64)]
        self._flows: dict[bytes, int] = {}
        # validated IPv4 header -> (forwarded header, priority, equal-cost egress ports)
        self.valid_ip: dict[bytes, tuple[bytes, int, tuple[int, ...]]] = {}

    def learn(self, header: bytes) -> tuple[bytes, int, tuple[int, ...]]:
        """For a validated IPv4 header: the header it leaves with (TTL - 1, checksum fixed by
        RFC 1624: the word (TTL, protocol) drops by 0x100, so the checksum rises by 0x100), its
        priority and its equal-cost egress ports.  Memoized in :attr:`valid_ip`."""
        if header[8] <= 1:
            out = header  # TTL expired: dropped by the caller, never forwarded
        else:
            word = header[8] << 8 | header[9]  # (TTL, protocol)
            csum = checksum_update(header[10] << 8 | header[11], word, word - 0x100)
            out = header[:8] + bytes((header[8] - 1, header[9])) + csum.to_bytes(2, "big")
            out += header[12:]
        dst = int.from_bytes(header[16:20], "big")
        cfg = self.config
        ports = cfg.routes.get(dst)
        if ports is None:  # a host reached by the default route, or no host at all
            ports = cfg.default_route if dst in cfg.hosts else ()
        entry = (out, self._prio[header[1] >> 2], ports)
        if len(self.valid_ip) > VALID_IP_MAX:
            self.valid_ip.clear()
        self.valid_ip[header] = entry
        return entry

    def ecmp(self, header: bytes, data: bytes, ports: tuple[int, ...]) -> int | None:
        """One of several equal-cost ports that is up, sticky per flow; None when none is (or
        the only one, which the caller tried first, is down)."""
        if len(ports) <= 1:
            return None
        mode = self._mode
        if mode == ECMP_DESTINATION:  # path pinning: the destination alone
            key = header[16:20]
        else:  # src, dst, sport, dport (and the destination QP: BTH bytes 5-7 after UDP)
            key = data[IP + 12 : IP + 24]
            if mode == ECMP_FIVE_TUPLE_QPN:
                key += data[IP + 33 : IP + 36]
        out = self._flows.get(key)
        if out is None or not self.ports[out].up:
            live = [p for p in ports if self.ports[p].up]
            if not live:
                return None
            if mode == ECMP_DESTINATION:  # consecutive destinations spread over the ports in turn
                out = live[int.from_bytes(key, "big") % len(live)]
            else:
                out = live[crc32(key, self._salt) % len(live)]
            if len(self._flows) > FLOWS_MAX:
                self._flows.clear()
            self._flows[key] = out
        return out

    def forget(self, routes: bool) -> None:
        """Links changed (``routes``: the routes too): choose the flows' ports again, and with
        new routes learn every header again."""
        self._flows.clear()
        if routes:
            self.valid_ip.clear()


class EcnMarker:
    """RED at dequeue on the queue's depth, per port and priority: CE only on ECT packets, on
    ECN's priorities, with the probability rising from 0 at Kmin to Pmax at Kmax (DCQCN's
    marking, RFC 3168's codepoints); counted on the port.  Holds the ports' thresholds (one
    object per distinct setting) and a seeded generator."""

    def __init__(self, config: SwitchConfig, ports: list[PortState]) -> None:
        self.ports = ports  # the switch's: where marks are counted
        self.ecn = config.ecn_of_ports()
        self._rng = random.Random(config.seed)
        # ECN's priorities as a bit mask (a frozenset's look-up boxes the priority)
        self._mask = 0
        if config.ecn_enabled:
            for prio in config.ecn_priorities:
                self._mask |= 1 << prio

    def mark(self, port: int, prio: int, datagram: bytes, depth: int) -> bytes:
        """``datagram``, leaving ``port``'s ``prio`` queue of ``depth`` bytes, marked or not."""
        if not self._mask >> prio & 1:
            return datagram
        tos = datagram[IP + 1]
        if not tos & 0b11 or tos & 0b11 == ECN_CE:
            return datagram
        t = self.ecn[port]
        if depth <= t.kmin_bytes:
            return datagram
        if depth < t.kmax_bytes:
            p = (depth - t.kmin_bytes) / (t.kmax_bytes - t.kmin_bytes) * t.pmax
            if self._rng.random() >= p:
                return datagram
        self.ports[port].ecn_marked[prio] += 1
        return set_ce(datagram, tos)


def set_ce(datagram: bytes, tos: int) -> bytes:
    """``datagram`` (IPv4 TOS ``tos``, ECT) marked Congestion Experienced, its IPv4 checksum
    fixed incrementally (RFC 1624)."""
    old_word = 0x45 << 8 | tos  # the (version/IHL, TOS) word
    csum = checksum_update(datagram[IP + 10] << 8 | datagram[IP + 11], old_word, old_word | ECN_CE)
    buf = bytearray(datagram)
    buf[IP + 1] = tos | ECN_CE
    buf[IP + 10 : IP + 12] = csum.to_bytes(2, "big")
    return bytes(buf)
