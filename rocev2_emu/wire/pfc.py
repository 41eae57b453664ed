"""IEEE 802.1Qbb priority-based flow control (PFC) frames.

A PFC frame is a MAC Control frame (EtherType 0x8808, IEEE 802.3 Annex 31B) sent to the reserved
multicast address 01:80:C2:00:00:01 with opcode 0x0101, a class-enable vector (bit i set: the
time for priority i is valid) and eight pause times in quanta of 512 bit times at the port's
speed (802.1Qbb §36.1.3).  A time of 0 for an enabled class resumes it (XON).
"""

from __future__ import annotations

import struct
from typing import Final, NamedTuple

from rocev2_emu.wire.errors import MalformedFrame
from rocev2_emu.wire.ethernet import ETH_HEADER, ETH_LEN, ETH_MIN_FRAME, ETHERTYPE_MAC_CONTROL
from rocev2_emu.wire.qos import PRIORITIES

PFC_DST_MAC: Final = bytes.fromhex("0180c2000001")
PFC_OPCODE: Final = 0x0101
PAUSE_OPCODE: Final = 0x0001  # 802.3x link-level PAUSE, recognised only to be rejected clearly
PFC_QUANTUM_BITS: Final = 512
MAX_QUANTA: Final = 0xFFFF

# opcode(16) | class-enable vector(16: reserved(8), C7..C0(8)) | time[0..7] (16 each)
PFC_BODY: Final = struct.Struct("!HH8H")
PFC_BODY_LEN: Final = 20


class PfcFrame(NamedTuple):
    dst_mac: bytes
    src_mac: bytes
    class_enable: int  # bit i set: quanta[i] is valid
    quanta: tuple[int, int, int, int, int, int, int, int]

    def pause_seconds(self, priority: int, link_bps: float) -> float:
        """How long ``priority`` stays paused at a link of ``link_bps`` bit/s (0: resume)."""
        return pause_time(self.quanta[priority], link_bps)


def pause_time(quanta: int, link_bps: float) -> float:
    """How long a pause of ``quanta`` lasts on a link of ``link_bps`` bit/s: 512 bit times a
    quantum (802.1Qbb §36.1.3.1); 0 resumes."""
    return quanta * PFC_QUANTUM_BITS / link_bps


def encode_pfc(src_mac: bytes, quanta: dict[int, int]) -> bytes:
    """A PFC frame that sets pause time ``quanta[p]`` for every priority p it names."""
    times = [0] * PRIORITIES
    enable = 0
    for prio, q in quanta.items():
        if not 0 <= prio < PRIORITIES:
            raise ValueError(f"PFC priority {prio} not in 0..7")
        if not 0 <= q <= MAX_QUANTA:
            raise ValueError(f"PFC quanta {q} not in 0..65535")
        times[prio] = q
        enable |= 1 << prio
    frame = ETH_HEADER.pack(PFC_DST_MAC, src_mac, ETHERTYPE_MAC_CONTROL) + PFC_BODY.pack(
        PFC_OPCODE, enable, *times
    )
    return frame + bytes(ETH_MIN_FRAME - len(frame))


def decode_pfc_untrusted(frame: bytes | bytearray | memoryview) -> PfcFrame:
    """Decode a MAC Control frame that must be a PFC frame."""
    if len(frame) < ETH_LEN + PFC_BODY_LEN:
        raise MalformedFrame(
            "truncated", f"PFC frame of {len(frame)} bytes < {ETH_LEN + PFC_BODY_LEN}"
        )
    dst, src, ethertype = ETH_HEADER.unpack_from(frame, 0)
    if ethertype != ETHERTYPE_MAC_CONTROL:
        raise MalformedFrame("ethertype", f"ethertype 0x{ethertype:04x} is not MAC Control")
    opcode, enable, *times = PFC_BODY.unpack_from(frame, ETH_LEN)
    if opcode != PFC_OPCODE:
        raise MalformedFrame(
            "mac_control_opcode",
            f"MAC Control opcode 0x{opcode:04x} != PFC 0x{PFC_OPCODE:04x}",
        )
    if enable >> 8:
        raise MalformedFrame("pfc", f"class-enable vector 0x{enable:04x} sets reserved bits")
    if dst != PFC_DST_MAC:
        raise MalformedFrame("pfc", f"PFC destination {dst.hex()} != 0180c2000001")
    q = tuple(times)
    return PfcFrame(
        bytes(dst), bytes(src), enable, (q[0], q[1], q[2], q[3], q[4], q[5], q[6], q[7])
    )
