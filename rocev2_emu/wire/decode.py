"""Decoding RoCEv2 frames from untrusted bytes: Ethernet / IPv4 / UDP 4791 / BTH / extension
headers / payload / ICRC (the layout :mod:`rocev2_emu.wire.roce` encodes), or a PFC frame.

:func:`decode_frame_untrusted` and :func:`decode_frame_at` are the only decoders; they raise
:class:`~rocev2_emu.wire.errors.MalformedFrame` and nothing else.  A header seen once is
remembered (bounded, :data:`_VALID_HEADERS_MAX` entries) with its ICRC state, so a flow's later
frames skip its checks.
"""

from __future__ import annotations

import struct
from typing import Final

from rocev2_emu.wire.bth import (
    ATOMIC_ACK_ETH,
    ATOMIC_ETH,
    BTH_LEN,
    DETH,
    ICRC_LEN,
    OPCODE_EXT_LEN,
    OPCODE_LAYOUT,
    Aeth,
    AtomicEth,
    Deth,
    Ext,
    Reth,
)
from rocev2_emu.wire.crc import crc32
from rocev2_emu.wire.errors import MalformedFrame
from rocev2_emu.wire.ethernet import (
    ETH_LEN,
    ETHERTYPE_IPV4,
    ETHERTYPE_MAC_CONTROL,
    IPPROTO_UDP,
    IPV4_LEN,
    ROCEV2_UDP_PORT,
    UDP_LEN,
    decode_vxlan_untrusted,
    ipv4_checksum,
)
from rocev2_emu.wire.pfc import PfcFrame, decode_pfc_untrusted
from rocev2_emu.wire.roce import RoceFrame, mask_icrc_fields

_ROCE_MIN: Final = ETH_LEN + IPV4_LEN + UDP_LEN + BTH_LEN + ICRC_LEN

# IPv4+UDP header bytes already validated, with the BTH's first word -> CRC state of the ICRC
# through BTH byte 4 (masked).  A pure memo (the key is every byte the state covers but the
# masked BTH byte), bounded; it spares the checksum, the masking and two CRC calls per packet.
# One for the process, shared by every NIC in it: it holds a header per flow, direction and
# frame length, so its bound is a thousand-flow incast's several thousand headers many times
# over (about 150 bytes an entry: some 10 MB at the bound), cleared when it is reached.
_VALID_HEADERS: Final[dict[bytes, int]] = {}
_VALID_HEADERS_MAX: Final = 65536
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
    mask_icrc_fields(masked)
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


_ZEROS: Final = memoryview(bytes(1 << 16))  # what an elided payload reads as (never a copy)


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
    view = _ZEROS if cut else memoryview(data)  # (an elided frame's: no view of its bytes)
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
            va = _u32(data, e) << 32 | _u32(data, e + 4)  # (no struct call, no tuple)
            reth = Reth(va, _u32(data, e + 8), _u32(data, e + 12))
            e += 16
        if layout & _X_ATOMIC_ETH:
            va, rkey, swap_add, compare = ATOMIC_ETH.unpack_from(data, e)
            atomic_eth = AtomicEth(va, rkey, swap_add, compare)
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
        data,
        at,
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
        view[: end - pad - e] if cut else view[e : end - pad],
        icrc,
    )


def decode_datagram_untrusted(
    datagram: bytes | bytearray | memoryview, *, verify_icrc: bool = True
) -> tuple[int, RoceFrame | PfcFrame]:
    """Decode a VXLAN datagram into (VNI, frame)."""
    vni, frame = decode_vxlan_untrusted(datagram)
    return vni, decode_frame_untrusted(frame, verify_icrc=verify_icrc)
