"""Whole RoCEv2 frames: Ethernet / IPv4 / UDP 4791 / BTH / extension headers / payload / ICRC.

Owns the invariant CRC (ICRC, IBTA Annex A17.3.3 and vol. 1 §7.8.1): CRC-32 over 8 bytes of
0xFF (the masked LRH), the IPv4 header with TOS, TTL and header checksum masked to ones, the UDP
header with its checksum masked, the BTH with byte 4 (FECN, BECN, resv6) masked, and everything
after up to the ICRC, which is sent little-endian.  Because the masked fields are exactly those a
switch rewrites (ECN in TOS, TTL, checksum), the ICRC survives CE marking and forwarding.

:class:`FrameTemplate` is the encoder: it precomputes a flow's VXLAN/Ethernet/IPv4/UDP prefix so
the hot path only packs lengths, BTH and checksums.  The decoder is
:mod:`rocev2_emu.wire.decode`.
"""

from __future__ import annotations

from typing import Final

from rocev2_emu.wire.bth import (
    AETH,
    ATOMIC_ACK_ETH,
    ATOMIC_ETH,
    BTH,
    BTH_LEN,
    DEFAULT_PKEY,
    ICRC_LEN,
    IMM,
    RETH,
    Aeth,
    AtomicEth,
    Deth,
    Reth,
)
from rocev2_emu.wire.crc import crc32
from rocev2_emu.wire.ethernet import (
    ECN_ECT0,
    ETH_HEADER,
    ETHERTYPE_IPV4,
    IPPROTO_UDP,
    IPV4_DF,
    IPV4_HEADER,
    IPV4_LEN,
    ROCEV2_UDP_PORT,
    UDP_HEADER,
    UDP_LEN,
    VXLAN_FLAG_I,
    VXLAN_HEADER,
)

DSCP_ROCE: Final = 26  # priority 3 by the default DSCP map
DSCP_CNP: Final = 48  # priority 6
_FIXED_LEN: Final = IPV4_LEN + UDP_LEN + BTH_LEN + ICRC_LEN
_PADS: Final = (b"", b"\0", b"\0\0", b"\0\0\0")


def rxe_udp_sport(qpn: int) -> int:
    """Per-QP UDP source port for ECMP entropy, as Linux rxe (rxe_qp.c): 0xC000 plus
    ``hash_32(qpn, 14)``, the top 14 bits of the QPN times the 32-bit golden ratio."""
    return 0xC000 | ((qpn * 0x61C88647) & 0xFFFFFFFF) >> 18


def mask_icrc_fields(masked: bytearray) -> None:
    masked[8 + 1] = 0xFF  # IPv4 TOS (DSCP + ECN)
    masked[8 + 8] = 0xFF  # IPv4 TTL
    masked[8 + 10] = masked[8 + 11] = 0xFF  # IPv4 header checksum
    masked[8 + 26] = masked[8 + 27] = 0xFF  # UDP checksum
    masked[8 + 32] = 0xFF  # BTH byte 4: FECN, BECN, resv6


class RoceFrame:
    """A decoded RoCEv2 frame: one native object per packet, its fields typed attributes
    (``payload`` a view of the received bytes, valid while they are; the MACs sliced from them
    only when read: nothing on the data path reads them)."""

    __match_args__ = (
        "dst_mac",
        "src_mac",
        "dscp",
        "ecn",
        "ttl",
        "ip_id",
        "src_ip",
        "dst_ip",
        "sport",
        "opcode",
        "solicited",
        "migreq",
        "pad",
        "tver",
        "pkey",
        "fecn",
        "becn",
        "dqpn",
        "ackreq",
        "psn",
        "reth",
        "aeth",
        "imm",
        "atomic_eth",
        "atomic_ack",
        "deth",
        "payload",
        "icrc",
    )

    def __init__(
        self,
        data: bytes,
        at: int,
        dscp: int,
        ecn: int,
        ttl: int,
        ip_id: int,
        src_ip: int,
        dst_ip: int,
        sport: int,
        opcode: int,
        solicited: bool,
        migreq: bool,
        pad: int,
        tver: int,
        pkey: int,
        fecn: bool,
        becn: bool,
        dqpn: int,
        ackreq: bool,
        psn: int,
        reth: Reth | None,
        aeth: Aeth | None,
        imm: int | None,
        atomic_eth: AtomicEth | None,
        atomic_ack: int | None,
        deth: Deth | None,
        payload: memoryview,
        icrc: int,
    ) -> None:
        self._data = data  # the frame's bytes from ``at``: its MACs are read when asked for
        self._at = at
        self.dscp = dscp
        self.ecn = ecn
        self.ttl = ttl
        self.ip_id = ip_id
        self.src_ip = src_ip
        self.dst_ip = dst_ip
        self.sport = sport
        self.opcode = opcode
        self.solicited = solicited
        self.migreq = migreq
        self.pad = pad
        self.tver = tver
        self.pkey = pkey
        self.fecn = fecn
        self.becn = becn
        self.dqpn = dqpn
        self.ackreq = ackreq
        self.psn = psn
        self.reth = reth
        self.aeth = aeth
        self.imm = imm
        self.atomic_eth = atomic_eth
        self.atomic_ack = atomic_ack
        self.deth = deth
        self.payload = payload
        self.icrc = icrc

    @property
    def dst_mac(self) -> bytes:
        return self._data[self._at : self._at + 6]

    @property
    def src_mac(self) -> bytes:
        return self._data[self._at + 6 : self._at + 12]

    def __repr__(self) -> str:
        fields = ", ".join(f"{n}={getattr(self, n)!r}" for n in self.__match_args__)
        return f"RoceFrame({fields})"


class FrameTemplate:
    """Encoder for one flow: fixed VXLAN VNI, MACs, IPs, UDP source port, DSCP and ECN.

    The VXLAN/Ethernet/IPv4/UDP headers of a flow depend only on the IPv4 total length (the
    IPv4 ID is 0 with DF set, as RFC 6864 allows for atomic datagrams), so they are built once
    per length together with the CRC state of the ICRC's masked prefix; a packet then costs two
    BTH packs, up to four CRC updates and one join.
    """

    __slots__ = (
        "_cache",
        "_ip_const",
        "_prefix",
        "dscp",
        "dst_ip",
        "ecn",
        "sport",
        "src_ip",
        "tos",
        "ttl",
    )

    def __init__(
        self,
        *,
        vni: int,
        src_mac: bytes,
        dst_mac: bytes,
        src_ip: int,
        dst_ip: int,
        sport: int,
        dscp: int = DSCP_ROCE,
        ecn: int = ECN_ECT0,
        ttl: int = 64,
    ) -> None:
        if not 0 <= dscp < 64 or not 0 <= ecn < 4:
            raise ValueError(f"DSCP {dscp} / ECN {ecn} out of range")
        self.src_ip, self.dst_ip, self.sport = src_ip, dst_ip, sport
        self.dscp, self.ecn, self.ttl = dscp, ecn, ttl
        self.tos = dscp << 2 | ecn
        self._prefix = VXLAN_HEADER.pack(VXLAN_FLAG_I, vni << 8) + ETH_HEADER.pack(
            dst_mac, src_mac, ETHERTYPE_IPV4
        )
        # One's-complement sum of the IPv4 words that never change for this flow.
        self._ip_const = (
            (0x45 << 8 | self.tos)
            + IPV4_DF
            + (ttl << 8 | IPPROTO_UDP)
            + (src_ip >> 16)
            + (src_ip & 0xFFFF)
            + (dst_ip >> 16)
            + (dst_ip & 0xFFFF)
        )
        # (total length << 16 | IPv4 ID) -> (headers, CRC): an int key, no tuple a frame
        self._cache: dict[int, tuple[bytes, int]] = {}

    def _headers(self, total: int, ip_id: int) -> tuple[bytes, int]:
        """(VXLAN+Ethernet+IPv4+UDP bytes, CRC of 8 x 0xFF + masked IPv4 + masked UDP)."""
        s = self._ip_const + total + ip_id
        s = (s & 0xFFFF) + (s >> 16)
        s = (s & 0xFFFF) + (s >> 16)
        ip_udp = IPV4_HEADER.pack(
            0x45,
            self.tos,
            total,
            ip_id,
            IPV4_DF,
            self.ttl,
            IPPROTO_UDP,
            ~s & 0xFFFF,
            self.src_ip,
            self.dst_ip,
        ) + UDP_HEADER.pack(self.sport, ROCEV2_UDP_PORT, total - IPV4_LEN, 0)
        masked = bytearray(b"\xff" * 8) + ip_udp + bytes(BTH_LEN)
        mask_icrc_fields(masked)
        entry = (self._prefix + ip_udp, crc32(memoryview(masked)[: 8 + IPV4_LEN + UDP_LEN]))
        if len(self._cache) >= 64:
            self._cache.clear()
        self._cache[total << 16 | ip_id] = entry
        return entry

    def build(
        self,
        opcode: int,
        dqpn: int,
        psn: int,
        ackreq: bool = False,
        solicited: bool = False,
        ext: bytes = b"",
        payload: bytes | bytearray | memoryview = b"",
        *,
        fecn: bool = False,
        becn: bool = False,
        ip_id: int = 0,
        pkey: int = DEFAULT_PKEY,
        elide: bool = False,
    ) -> bytes:
        """The complete VXLAN datagram of one RoCEv2 packet, ICRC included; ``elide`` (a
        timing-only run): its headers only - the IPv4 and UDP lengths and the BTH's pad count
        say the whole packet, the payload, pad and ICRC stay behind, no CRC is computed."""
        plen = len(payload)
        pad = -plen & 3
        total = _FIXED_LEN + len(ext) + plen + pad
        entry = self._cache.get(total << 16 | ip_id)
        headers, crc = entry if entry is not None else self._headers(total, ip_id)
        flags = solicited << 7 | pad << 4
        word2 = ackreq << 31 | psn
        bth = BTH.pack(opcode, flags, pkey, fecn << 31 | becn << 30 | dqpn, word2)
        if elide:
            return b"".join((headers, bth, ext))
        masked = bytearray(bth)  # the ICRC's view of the BTH: FECN, BECN and resv6 as ones
        masked[4] = 0xFF
        crc = crc32(masked, crc)
        if ext:
            crc = crc32(ext, crc)
        if plen:
            crc = crc32(payload, crc)
        if pad:
            crc = crc32(_PADS[pad], crc)
        return b"".join((headers, bth, ext, payload, _PADS[pad], crc.to_bytes(4, "little")))


def pack_reth(va: int, rkey: int, dma_len: int) -> bytes:
    return RETH.pack(va, rkey, dma_len)


def pack_aeth(syndrome: int, msn: int) -> bytes:
    return AETH.pack(syndrome << 24 | (msn & 0xFFFFFF))


def pack_atomic_eth(va: int, rkey: int, swap_add: int, compare: int) -> bytes:
    return ATOMIC_ETH.pack(va, rkey, swap_add, compare)


def pack_imm(imm: int) -> bytes:
    return IMM.pack(imm)


def pack_atomic_ack(orig: int) -> bytes:
    return ATOMIC_ACK_ETH.pack(orig)
