"""Whole RoCEv2 frames: Ethernet / IPv4 / UDP 4791 / BTH / extension headers / payload / ICRC.

Owns the invariant CRC (ICRC, IBTA Annex A17.3.3 and vol. 1 §7.8.1): CRC-32 over 8 bytes of
0xFF (the masked LRH), the IPv4 header with TOS, TTL and header checksum masked to ones, the UDP
header with its checksum masked, the BTH with byte 4 (FECN, BECN, resv6) masked, and everything
after up to the ICRC, which is sent little-endian.  Because the masked fields are exactly those a
switch rewrites (ECN in TOS, TTL, checksum), the ICRC survives CE marking and forwarding.

:class:`FrameTemplate` is the encoder: it precomputes a flow's VXLAN/Ethernet/IPv4/UDP prefix so
the hot path only packs lengths, BTH and checksums.  :func:`decode_frame_untrusted` is the only
decoder; it raises :class:`~rocev2_emu.wire.errors.MalformedFrame` and nothing else.
"""

from __future__ import annotations

import struct
from typing import Final

from rocev2_emu.wire.bth import (
    AETH,
    ATOMIC_ACK_ETH,
    ATOMIC_ETH,
    BTH,
    BTH_LEN,
    DEFAULT_PKEY,
    DETH,
    ICRC_LEN,
    IMM,
    OPCODE_EXT_LEN,
    OPCODE_LAYOUT,
    RETH,
    Aeth,
    AtomicEth,
    Deth,
    Ext,
    Reth,
)
from rocev2_emu.wire.crc import crc32
from rocev2_emu.wire.errors import MalformedFrame
from rocev2_emu.wire.ethernet import (
    ECN_ECT0,
    ETH_HEADER,
    ETH_LEN,
    ETHERTYPE_IPV4,
    ETHERTYPE_MAC_CONTROL,
    IPPROTO_UDP,
    IPV4_DF,
    IPV4_HEADER,
    IPV4_LEN,
    ROCEV2_UDP_PORT,
    UDP_HEADER,
    UDP_LEN,
    VXLAN_FLAG_I,
    VXLAN_HEADER,
    decode_vxlan_untrusted,
    ipv4_checksum,
)
from rocev2_emu.wire.pfc import PfcFrame, decode_pfc_untrusted

DSCP_ROCE: Final = 26  # priority 3 by the default DSCP map
DSCP_CNP: Final = 48  # priority 6
ICRC_LE: Final = struct.Struct("<I")
_ROCE_MIN: Final = ETH_LEN + IPV4_LEN + UDP_LEN + BTH_LEN + ICRC_LEN
_FIXED_LEN: Final = IPV4_LEN + UDP_LEN + BTH_LEN + ICRC_LEN
_PADS: Final = (b"", b"\0", b"\0\0", b"\0\0\0")


def rxe_udp_sport(qpn: int) -> int:
    """Per-QP UDP source port for ECMP entropy, as Linux rxe (rxe_qp.c): 0xC000 plus
    ``hash_32(qpn, 14)``, the top 14 bits of the QPN times the 32-bit golden ratio."""
    return 0xC000 | ((qpn * 0x61C88647) & 0xFFFFFFFF) >> 18


def _mask(masked: bytearray) -> None:
    masked[8 + 1] = 0xFF  # IPv4 TOS (DSCP + ECN)
    masked[8 + 8] = 0xFF  # IPv4 TTL
    masked[8 + 10] = masked[8 + 11] = 0xFF  # IPv4 header checksum
    masked[8 + 26] = masked[8 + 27] = 0xFF  # UDP checksum
    masked[8 + 32] = 0xFF  # BTH byte 4: FECN, BECN, resv6


class RoceFrame:
    """A decoded RoCEv2 frame: one native object per packet, its fields typed attributes
    (``payload`` a view of the received bytes, valid while they are)."""

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
        dst_mac: bytes,
        src_mac: bytes,
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
        self.dst_mac = dst_mac
        self.src_mac = src_mac
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
        self._cache: dict[tuple[int, int], tuple[bytes, int]] = {}

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
        _mask(masked)
        entry = (self._prefix + ip_udp, crc32(memoryview(masked)[: 8 + IPV4_LEN + UDP_LEN]))
        if len(self._cache) >= 64:
            self._cache.clear()
        self._cache[total, ip_id] = entry
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
        entry = self._cache.get((total, ip_id))
        headers, crc = entry if entry is not None else self._headers(total, ip_id)
        flags = solicited << 7 | pad << 4
        word2 = ackreq << 31 | psn
        if elide:
            bth = BTH.pack(opcode, flags, pkey, fecn << 31 | becn << 30 | dqpn, word2)
            return b"".join((headers, bth, ext))
        crc = crc32(BTH.pack(opcode, flags, pkey, 0xFF000000 | dqpn, word2), crc)
        if ext:
            crc = crc32(ext, crc)
        if plen:
            crc = crc32(payload, crc)
        if pad:
            crc = crc32(_PADS[pad], crc)
        bth = BTH.pack(opcode, flags, pkey, fecn << 31 | becn << 30 | dqpn, word2)
        return b"".join((headers, bth, ext, payload, _PADS[pad], ICRC_LE.pack(crc)))


# IPv4+UDP header bytes already validated, with the BTH's first word -> CRC state of the ICRC
# through BTH byte 4 (masked).  A pure memo (the key is every byte the state covers but the
# masked BTH byte), bounded; it spares the checksum, the masking and two CRC calls per packet.
_VALID_HEADERS: Final[dict[bytes, int]] = {}
_VALID_HEADERS_MAX: Final = 4096
_IPUDP: Final = struct.Struct("!BBHHHBBHIIHHHH")
_BTH_AT: Final = ETH_LEN + IPV4_LEN + UDP_LEN
_EXT_AT: Final = _BTH_AT + BTH_LEN


def _check_ip_udp(header: bytes) -> int:
    """Validate an IPv4+UDP header (followed by the BTH's first word) seen for the first time;
    returns the ICRC's CRC state through BTH byte 4."""
    vihl, _tos, total, _id, _frag, _ttl, proto, csum, *_rest, dport, udp_len, _c = (
        _IPUDP.unpack_from(header)
    )
    if vihl != 0x45:
        raise MalformedFrame("ipv4", f"IPv4 version/IHL 0x{vihl:02x} != 0x45 (options unsupported)")
    if ipv4_checksum(header) != 0:
        raise MalformedFrame("ipv4_checksum", f"IPv4 header checksum 0x{csum:04x} is wrong")
    if proto != IPPROTO_UDP:
        raise MalformedFrame("ipv4_protocol", f"IPv4 protocol {proto} is not UDP (17)")
    if dport != ROCEV2_UDP_PORT:
        raise MalformedFrame("udp_port", f"UDP destination port {dport} is not RoCEv2 (4791)")
    if udp_len != total - IPV4_LEN:
        raise MalformedFrame("udp_length", f"UDP length {udp_len} != IPv4 payload {total - 20}")
    masked = bytearray(b"\xff" * 8) + header + bytes(BTH_LEN - 4)
    _mask(masked)
    crc = crc32(memoryview(masked)[: 8 + IPV4_LEN + UDP_LEN + 5])
    if len(_VALID_HEADERS) >= _VALID_HEADERS_MAX:
        _VALID_HEADERS.clear()
    _VALID_HEADERS[header] = crc
    return crc


# The layouts as plain ints, indexed by opcode (-1: not supported): an IntFlag's ``&`` is a
# Python-level call, and a list index is cheaper than a dict look-up on every frame
_LAYOUT: Final = [int(OPCODE_LAYOUT[op]) if op in OPCODE_LAYOUT else -1 for op in range(256)]
_EXT_LEN: Final = [OPCODE_EXT_LEN.get(op, 0) for op in range(256)]
# each its own Final: the compiled module reads a C static, not its globals dict, per frame
_X_DETH: Final = int(Ext.DETH)
_X_RETH: Final = int(Ext.RETH)
_X_ATOMIC_ETH: Final = int(Ext.ATOMIC_ETH)
_X_AETH: Final = int(Ext.AETH)
_X_ATOMIC_ACK_ETH: Final = int(Ext.ATOMIC_ACK_ETH)
_X_IMM: Final = int(Ext.IMM)
_X_CNP_PAD: Final = int(Ext.CNP_PAD)


def decode_frame_untrusted(
    frame: bytes | bytearray | memoryview, *, verify_icrc: bool = True
) -> RoceFrame | PfcFrame:
    """Decode one Ethernet frame (no FCS) that must be RoCEv2 over IPv4, or a PFC frame."""
    return decode_frame_at(frame if type(frame) is bytes else bytes(frame), 0, verify_icrc)


def _u16(data: bytes, i: int) -> int:
    return data[i] << 8 | data[i + 1]


def _u32(data: bytes, i: int) -> int:
    return data[i] << 24 | data[i + 1] << 16 | data[i + 2] << 8 | data[i + 3]


_ZEROS: Final = bytes(1 << 16)  # what an elided payload reads as (a view, never a copy)


def decode_frame_at(
    data: bytes, at: int, verify_icrc: bool = True, elided: bool = False
) -> RoceFrame | PfcFrame:
    """:func:`decode_frame_untrusted` of the frame that starts at ``data[at]`` (a NIC passes a
    whole VXLAN datagram and the frame's offset: no copy, no view of the headers).  ``elided``
    (a timing-only run): a frame that ends exactly where its payload would begin, while its
    IPv4 length says more, is the headers of a whole frame (:meth:`FrameTemplate.build`'s
    ``elide``): its payload reads as zeros, its ICRC as 0 and is not checked.  Any other frame
    shorter than its IPv4 length is truncated, as without ``elided``."""
    n = len(data) - at
    if n < ETH_LEN:
        raise MalformedFrame("truncated", f"Ethernet frame of {n} bytes < {ETH_LEN}")
    ethertype = _u16(data, at + 12)
    if ethertype != ETHERTYPE_IPV4:
        if ethertype == ETHERTYPE_MAC_CONTROL:
            return decode_pfc_untrusted(memoryview(data)[at:])
        raise MalformedFrame("ethertype", f"ethertype 0x{ethertype:04x} is neither IPv4 nor PFC")
    if n < _ROCE_MIN - (ICRC_LEN if elided else 0):  # (an elided frame has no ICRC)
        raise MalformedFrame("truncated", f"IPv4 RoCE frame of {n} bytes < {_ROCE_MIN}")
    ip = at + ETH_LEN
    header = data[ip : ip + IPV4_LEN + UDP_LEN + 4]
    crc = _VALID_HEADERS.get(header)
    if crc is None:
        crc = _check_ip_udp(header)
    total = _u16(data, ip + 2)
    cut = elided and total > n - ETH_LEN  # (checked below: only where the payload begins)
    if (total > n - ETH_LEN and not cut) or total < IPV4_LEN + UDP_LEN + BTH_LEN + ICRC_LEN:
        raise MalformedFrame(
            "truncated", f"IPv4 total length {total} vs {n - ETH_LEN} bytes after Ethernet"
        )
    b = at + _BTH_AT
    opcode = data[b]
    flags = data[b + 1]
    layout = _LAYOUT[opcode]
    if layout < 0:
        raise MalformedFrame("opcode", f"BTH opcode 0x{opcode:02x} is not supported")
    tver = flags & 0x0F
    if tver != 0:
        raise MalformedFrame("bth_tver", f"BTH transport version {tver} != 0")
    end = ip + total - ICRC_LEN
    e = at + _EXT_AT
    elen = _EXT_LEN[opcode]
    pad = flags >> 4 & 3
    if e + elen + pad > end:
        raise MalformedFrame(
            "truncated",
            f"opcode 0x{opcode:02x} needs {elen} header bytes + pad {pad}, "
            f"{end - e} left before the ICRC",
        )
    if cut:
        if len(data) != e + elen:
            raise MalformedFrame(
                "truncated", f"IPv4 total length {total} vs {n - ETH_LEN} bytes after Ethernet"
            )
        icrc = 0
    else:
        icrc = data[end] | data[end + 1] << 8 | data[end + 2] << 16 | data[end + 3] << 24
    view = memoryview(data)
    if verify_icrc and not cut:
        # ``crc`` went through BTH byte 4 (FECN, BECN, resv6, masked): the rest up to the ICRC
        computed = crc32(view[b + 5 : end], crc)
        if computed != icrc:
            raise MalformedFrame("icrc", f"ICRC 0x{icrc:08x} != computed 0x{computed:08x}")
    word1 = _u32(data, b + 4)
    reth: Reth | None = None
    aeth: Aeth | None = None
    atomic_eth: AtomicEth | None = None
    deth: Deth | None = None
    imm: int | None = None
    atomic_ack: int | None = None
    if layout:
        if layout & _X_DETH:
            qkey, sqp = DETH.unpack_from(data, e)
            deth = Deth(qkey, sqp & 0xFFFFFF)
            e += 8
        if layout & _X_RETH:
            reth = Reth._make(RETH.unpack_from(data, e))
            e += 16
        if layout & _X_ATOMIC_ETH:
            atomic_eth = AtomicEth._make(ATOMIC_ETH.unpack_from(data, e))
            e += 28
        if layout & _X_AETH:
            word = _u32(data, e)
            aeth = Aeth(word >> 24, word & 0xFFFFFF)
            e += 4
        if layout & _X_ATOMIC_ACK_ETH:
            atomic_ack = ATOMIC_ACK_ETH.unpack_from(data, e)[0]
            e += 8
        if layout & _X_IMM:
            imm = _u32(data, e)
            e += 4
        if layout & _X_CNP_PAD:
            e += 16
    tos = data[ip + 1]
    word2 = _u32(data, b + 8)
    return RoceFrame(
        data[at : at + 6],
        data[at + 6 : at + 12],
        tos >> 2,
        tos & 3,
        data[ip + 8],
        _u16(data, ip + 4),
        _u32(data, ip + 12),
        _u32(data, ip + 16),
        _u16(data, ip + 20),
        opcode,
        bool(flags & 0x80),
        bool(flags & 0x40),
        pad,
        tver,
        _u16(data, b + 2),
        bool(word1 >> 31),
        bool(word1 >> 30 & 1),
        word1 & 0xFFFFFF,
        bool(word2 >> 31),
        word2 & 0xFFFFFF,
        reth,
        aeth,
        imm,
        atomic_eth,
        atomic_ack,
        deth,
        memoryview(_ZEROS)[: end - pad - e] if cut else view[e : end - pad],
        icrc,
    )


def decode_datagram_untrusted(
    datagram: bytes | bytearray | memoryview, *, verify_icrc: bool = True
) -> tuple[int, RoceFrame | PfcFrame]:
    """Decode a VXLAN datagram into (VNI, frame)."""
    vni, frame = decode_vxlan_untrusted(datagram)
    return vni, decode_frame_untrusted(frame, verify_icrc=verify_icrc)


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
