"""Outer layers of every emulated frame: VXLAN (RFC 7348), Ethernet II, IPv4 (RFC 791) and UDP.

Each datagram between two nodes is a VXLAN header whose VNI names the link, followed by one
complete Ethernet frame (no FCS).  This module owns those headers, the IPv4 header checksum
(RFC 1071) and address helpers.  The RoCE layers above UDP live in :mod:`rocev2_emu.wire.bth`; whole
RoCE frames are assembled in :mod:`rocev2_emu.wire.roce`.
"""

from __future__ import annotations

import ipaddress
import struct
from typing import Final

from rocev2_emu.wire.errors import MalformedFrame

VXLAN_UDP_PORT: Final = 4789  # IANA, RFC 7348 §5
# The UDP port the emulator's links use by default.  Not 4789: docker's overlay networks and
# the kernel's own vxlan devices bind that one, so an emulator on it collides with a swarm.
# Wireshark decodes it as VXLAN when told: tshark -d udp.port==14789,vxlan
LINK_UDP_PORT: Final = 14789
ROCEV2_UDP_PORT: Final = 4791  # IANA, RoCEv2 (IBTA Annex A17)
ETHERTYPE_IPV4: Final = 0x0800
ETHERTYPE_MAC_CONTROL: Final = 0x8808  # IEEE 802.3 Annex 31B, carries 802.1Qbb PFC
IPPROTO_UDP: Final = 17
ETH_MIN_FRAME: Final = 60  # minimum Ethernet frame without FCS

# VXLAN header, RFC 7348 §5:
#   flags(8, I bit = 0x08) | reserved(24) | VNI(24) | reserved(8)
VXLAN_HEADER: Final = struct.Struct("!B3xI")
VXLAN_FLAG_I: Final = 0x08
VXLAN_LEN: Final = 8

# Ethernet II: dst(48) | src(48) | ethertype(16)
ETH_HEADER: Final = struct.Struct("!6s6sH")
ETH_LEN: Final = 14

# IPv4 without options:
#   ver/ihl(8) | tos = DSCP(6) ECN(2) | total length(16) | id(16) | flags/frag(16)
#   | ttl(8) | protocol(8) | header checksum(16) | src(32) | dst(32)
IPV4_HEADER: Final = struct.Struct("!BBHHHBBHII")
IPV4_LEN: Final = 20
IPV4_WORDS: Final = struct.Struct("!10H")
IPV4_DF: Final = 0x4000

# UDP: sport(16) | dport(16) | length(16) | checksum(16)
UDP_HEADER: Final = struct.Struct("!HHHH")
UDP_LEN: Final = 8

# ECN codepoints, RFC 3168 §5
ECN_NOT_ECT: Final = 0b00
ECN_ECT1: Final = 0b01
ECN_ECT0: Final = 0b10
ECN_CE: Final = 0b11


def ipv4_checksum(header: bytes | bytearray | memoryview) -> int:
    """RFC 1071 one's-complement checksum of a 20-byte IPv4 header (checksum field included)."""
    total: int = sum(IPV4_WORDS.unpack_from(header, 0))
    total = (total & 0xFFFF) + (total >> 16)
    total = (total & 0xFFFF) + (total >> 16)
    return ~total & 0xFFFF


def checksum_update(checksum: int, old_word: int, new_word: int) -> int:
    """An Internet checksum after one 16-bit word of what it covers changed from ``old_word``
    to ``new_word``, without summing the rest again: RFC 1624 eqn. 3, HC' = ~(~HC + ~m + m')
    (which, unlike RFC 1141's form, never yields 0xFFFF for a zero sum)."""
    s = (~checksum & 0xFFFF) + (~old_word & 0xFFFF) + new_word
    s = (s & 0xFFFF) + (s >> 16)
    s = (s & 0xFFFF) + (s >> 16)
    return ~s & 0xFFFF


_IP_INTS: Final[dict[str, int]] = {}  # addresses already parsed (a NIC's QPs share peers)


def wire_len(datagram: bytes) -> int:
    """The length on the wire (an Ethernet frame without FCS) of the frame in a VXLAN datagram
    whose payload may be elided, as a timing-only run's are (its headers travel, the IPv4
    total length still counts the payload, the pad and the ICRC): 14 + that length for an IPv4
    frame, what is there for any other.  For a whole frame it is ``len(datagram) - 8``.
    ``bytes`` only: the compiled build indexes them natively (a union would go through the
    generic protocol, on every frame of a timing-only run)."""
    if len(datagram) >= VXLAN_LEN + ETH_LEN + 4 and datagram[20] == 8 and datagram[21] == 0:
        return ETH_LEN + (
            datagram[VXLAN_LEN + ETH_LEN + 2] << 8 | datagram[VXLAN_LEN + ETH_LEN + 3]
        )
    return max(0, len(datagram) - VXLAN_LEN)


def ip_to_int(address: str) -> int:
    """A dotted-quad IPv4 address as an integer; ValueError for anything else."""
    value = _IP_INTS.get(address)
    if value is None:
        value = int(ipaddress.IPv4Address(address))
        if len(_IP_INTS) < 1 << 16:
            _IP_INTS[address] = value
    return value


def mac_for_ip(ip: int) -> bytes:
    """A locally administered unicast MAC derived from an IPv4 address: 02:00:a:b:c:d."""
    return b"\x02\x00" + ip.to_bytes(4, "big")


def encode_vxlan(vni: int, frame: bytes | bytearray | memoryview) -> bytes:
    """Prefix an Ethernet frame with a VXLAN header naming link ``vni``."""
    if not 0 <= vni < 1 << 24:
        raise ValueError(f"VXLAN VNI {vni} does not fit in 24 bits")
    return VXLAN_HEADER.pack(VXLAN_FLAG_I, vni << 8) + bytes(frame)


def decode_vxlan_untrusted(datagram: bytes | bytearray | memoryview) -> tuple[int, memoryview]:
    """Split a VXLAN datagram into (VNI, Ethernet frame view)."""
    if len(datagram) < VXLAN_LEN + ETH_LEN:
        raise MalformedFrame(
            "truncated", f"VXLAN datagram of {len(datagram)} bytes < {VXLAN_LEN + ETH_LEN}"
        )
    flags, vni_word = VXLAN_HEADER.unpack_from(datagram, 0)
    if not flags & VXLAN_FLAG_I:
        raise MalformedFrame("vxlan", f"VXLAN flags 0x{flags:02x} lack the I bit (0x08)")
    return vni_word >> 8, memoryview(datagram)[VXLAN_LEN:]
