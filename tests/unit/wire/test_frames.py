"""Frame codecs against independent decoders (scapy's RoCE and MAC-control layers), golden
vectors, truncated twins and a fuzz property."""

from __future__ import annotations

import contextlib
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scapy.contrib.mac_control import MACControlClassBasedFlowControl
from scapy.contrib.roce import AETH, BTH
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import Ether
from scapy.packet import Raw

from rocev2_emu.wire.bth import NakCode, Opcode, psn_add, psn_diff
from rocev2_emu.wire.decode import decode_datagram_untrusted, decode_frame_untrusted
from rocev2_emu.wire.errors import MalformedFrame
from rocev2_emu.wire.ethernet import ECN_CE, ipv4_checksum
from rocev2_emu.wire.pfc import PFC_DST_MAC, PfcFrame, decode_pfc_untrusted, encode_pfc
from rocev2_emu.wire.roce import (
    DSCP_CNP,
    FrameTemplate,
    RoceFrame,
    pack_aeth,
    pack_atomic_ack,
    pack_atomic_eth,
    pack_imm,
    pack_reth,
    rxe_udp_sport,
)

# scapy test/contrib/roce.uts: a UC SEND_ONLY with pad count 2 and ICRC 0x78f353f3
UC_SEND = bytes(
    Ether(dst="24:8a:07:a8:fa:22", src="24:8a:07:a8:fa:22")
    / IP(
        version=4,
        ihl=5,
        tos=0x1,
        id=1144,
        flags="DF",
        frag=0,
        ttl=64,
        src="192.168.0.7",
        dst="192.168.0.7",
        len=64,
    )
    / UDP(sport=49152, dport=4791, len=44)
    / BTH(opcode="UC_SEND_ONLY", migreq=1, padcount=2, pkey=0xFFFF, dqpn=211, psn=13571856)
    / Raw(b"F0\x81\x8b\xe2\x895\xd9\x0e\x9a\x95PT\x01\xbe\x88^P\x00\x00")
)
# scapy test/contrib/roce.uts: a CNP captured on a ConnectX-4 Lx, ICRC 0x82fd002a
CX4_CNP = bytes.fromhex(
    "e41d2dab2bc27cfe90643b32080045c2"
    "003c718c4000401191610a0011010a00"
    "1201000012b7002800008100ffff4000"
    "01180000000000000000000000000000"
    "00000000000082fd002a"
)


def _template(**kw: int) -> FrameTemplate:
    args = dict(
        vni=7,
        src_mac=bytes.fromhex("020000000001"),
        dst_mac=bytes.fromhex("020000000002"),
        src_ip=0x0A000001,
        dst_ip=0x0A000002,
        sport=rxe_udp_sport(0x1234),
    )
    args.update(kw)
    return FrameTemplate(**args)  # type: ignore[arg-type]


def _roce(frame: bytes) -> RoceFrame:
    f = decode_frame_untrusted(frame)
    assert isinstance(f, RoceFrame)
    return f


def test_scapy_uc_send_vector_decodes_with_its_icrc() -> None:
    f = _roce(UC_SEND)
    assert f.opcode == Opcode.UC_SEND_ONLY
    assert (f.dqpn, f.psn, f.pad, f.migreq) == (211, 13571856, 2, True)
    assert UC_SEND[-4:] == bytes.fromhex("78f353f3")
    assert f.icrc == int.from_bytes(bytes.fromhex("78f353f3"), "little")
    assert bytes(f.payload) == b"F0\x81\x8b\xe2\x895\xd9\x0e\x9a\x95PT\x01\xbe\x88^P"
    assert ipv4_checksum(UC_SEND[14:34]) == 0 and UC_SEND[24:26] == bytes.fromhex("b4d5")


def test_connectx4_cnp_vector() -> None:
    f = _roce(CX4_CNP)
    assert f.opcode == Opcode.CNP and int(f.opcode) == 0x81
    assert f.becn and not f.fecn
    assert (f.dqpn, f.psn, f.dscp, f.pkey) == (0x118, 0, DSCP_CNP, 0xFFFF)
    assert CX4_CNP[-4:] == bytes.fromhex("82fd002a")


def _all_kinds() -> list[tuple[str, bytes]]:
    t = _template()
    payload = bytes(range(256)) * 4
    Op = Opcode
    frames = [
        ("send_only", t.build(Op.RC_SEND_ONLY, dqpn=0x11, psn=5, ackreq=True, payload=b"hi!")),
        (
            "send_imm",
            t.build(
                Op.RC_SEND_ONLY_WITH_IMMEDIATE,
                dqpn=0x11,
                psn=6,
                ext=pack_imm(0xDEADBEEF),
                payload=b"x" * 13,
            ),
        ),
        ("send_first", t.build(Op.RC_SEND_FIRST, dqpn=0x11, psn=7, payload=payload)),
        ("send_middle", t.build(Op.RC_SEND_MIDDLE, dqpn=0x11, psn=8, payload=payload)),
        ("send_last", t.build(Op.RC_SEND_LAST, dqpn=0x11, psn=9, ackreq=True, payload=b"z")),
        (
            "write_first",
            t.build(
                Op.RC_RDMA_WRITE_FIRST,
                dqpn=0x11,
                psn=0xFFFFFF,
                ext=pack_reth(0x7F0000001000, 0xABCDEF01, 5000),
                payload=payload,
            ),
        ),
        (
            "write_last_imm",
            t.build(
                Op.RC_RDMA_WRITE_LAST_WITH_IMMEDIATE,
                dqpn=0x11,
                psn=0,
                ackreq=True,
                ext=pack_imm(7),
                payload=b"ab",
            ),
        ),
        (
            "write_only_imm",
            t.build(
                Op.RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE,
                dqpn=0x11,
                psn=1,
                ext=pack_reth(0x1000, 1, 3) + pack_imm(9),
                payload=b"abc",
            ),
        ),
        (
            "read_request",
            t.build(Op.RC_RDMA_READ_REQUEST, dqpn=0x11, psn=2, ext=pack_reth(0x2000, 2, 1 << 20)),
        ),
        (
            "read_resp_first",
            t.build(
                Op.RC_RDMA_READ_RESPONSE_FIRST,
                dqpn=0x22,
                psn=2,
                ext=pack_aeth(0x1F, 4),
                payload=payload,
            ),
        ),
        (
            "read_resp_middle",
            t.build(Op.RC_RDMA_READ_RESPONSE_MIDDLE, dqpn=0x22, psn=3, payload=payload),
        ),
        ("ack", t.build(Op.RC_ACKNOWLEDGE, dqpn=0x22, psn=9, ext=pack_aeth(0x1F, 3))),
        (
            "nak_seq",
            t.build(
                Op.RC_ACKNOWLEDGE,
                dqpn=0x22,
                psn=9,
                ext=pack_aeth(0x60 | NakCode.PSN_SEQUENCE_ERROR, 3),
            ),
        ),
        (
            "cmp_swap",
            t.build(Op.RC_COMPARE_SWAP, dqpn=0x11, psn=10, ext=pack_atomic_eth(0x3000, 3, 42, 41)),
        ),
        (
            "fetch_add",
            t.build(Op.RC_FETCH_ADD, dqpn=0x11, psn=11, ext=pack_atomic_eth(0x3008, 3, 1, 0)),
        ),
        (
            "atomic_ack",
            t.build(
                Op.RC_ATOMIC_ACKNOWLEDGE,
                dqpn=0x22,
                psn=11,
                ext=pack_aeth(0, 5) + pack_atomic_ack(41),
            ),
        ),
        ("cnp", _template(dscp=DSCP_CNP).build(Op.CNP, dqpn=0x11, psn=0, becn=True, ext=bytes(16))),
    ]
    return [(name, bytes(d[8:])) for name, d in frames]


KINDS = _all_kinds()


@pytest.mark.parametrize(("name", "frame"), KINDS, ids=[k for k, _ in KINDS])
def test_every_frame_we_emit_decodes_in_scapy_with_the_same_icrc(name: str, frame: bytes) -> None:
    ours = _roce(frame)
    pkt = Ether(frame)
    assert pkt[IP].chksum == int.from_bytes(frame[24:26], "big")
    assert pkt[UDP].dport == 4791 and pkt[UDP].sport == rxe_udp_sport(0x1234)
    bth = pkt[BTH]
    assert (bth.opcode, bth.psn, bth.dqpn, bth.ackreq, bth.padcount) == (
        ours.opcode,
        ours.psn,
        ours.dqpn,
        int(ours.ackreq),
        ours.pad,
    )
    assert bth.icrc == int.from_bytes(frame[-4:], "big")
    # scapy recomputes the ICRC itself when the field is cleared
    del pkt[BTH].icrc
    rebuilt = Ether(bytes(pkt))
    assert rebuilt[BTH].icrc == int.from_bytes(frame[-4:], "big")
    if ours.opcode == Opcode.RC_ACKNOWLEDGE:
        assert ours.aeth is not None
        assert pkt[AETH].syndrome == ours.aeth.syndrome and pkt[AETH].msn == ours.aeth.msn


def test_fields_round_trip() -> None:
    f = _roce(dict(KINDS)["write_first"])
    assert f.reth is not None
    assert (f.reth.va, f.reth.rkey, f.reth.dma_len) == (0x7F0000001000, 0xABCDEF01, 5000)
    assert f.psn == 0xFFFFFF and len(f.payload) == 1024 and f.ecn == 2 and f.dscp == 26
    f = _roce(dict(KINDS)["write_only_imm"])
    assert f.imm == 9 and f.reth is not None and f.reth.dma_len == 3
    assert bytes(f.payload) == b"abc" and f.pad == 1
    f = _roce(dict(KINDS)["cmp_swap"])
    assert f.atomic_eth is not None
    assert (f.atomic_eth.swap_add, f.atomic_eth.compare) == (42, 41)
    f = _roce(dict(KINDS)["atomic_ack"])
    assert f.atomic_ack == 41 and f.aeth is not None and f.aeth.msn == 5


def test_ce_marking_keeps_the_icrc_valid() -> None:
    frame = bytearray(dict(KINDS)["write_first"])
    frame[15] |= ECN_CE  # a switch marks CE ...
    frame[22] -= 1  # ... and decrements the TTL ...
    frame[24:26] = b"\0\0"
    frame[24:26] = ipv4_checksum(frame[14:34]).to_bytes(2, "big")  # ... and fixes the checksum
    f = _roce(bytes(frame))
    assert f.ecn == ECN_CE and f.ttl == 63


def test_icrc_matches_an_independent_crc32() -> None:
    frame = dict(KINDS)["send_only"]
    masked = bytearray(b"\xff" * 8 + frame[14:54])
    masked[8 + 1] = masked[8 + 8] = 0xFF
    masked[8 + 10 : 8 + 12] = b"\xff\xff"
    masked[8 + 26 : 8 + 28] = b"\xff\xff"
    masked[8 + 32] = 0xFF
    assert zlib.crc32(bytes(masked) + frame[54:-4]).to_bytes(4, "little") == frame[-4:]


def test_rxe_source_port_is_0xc000_plus_hash32_of_qpn() -> None:
    # hash_32(0x11, 14) = (0x11 * 0x61C88647 mod 2^32) >> 18, computed by hand: 0x1E6C
    assert rxe_udp_sport(0x11) == 0xC000 + ((0x11 * 0x61C88647) % 2**32 >> 18)
    ports = {rxe_udp_sport(q) for q in range(2, 2000)}
    assert all(0xC000 <= p <= 0xFFFF for p in ports) and len(ports) > 1500


def test_pfc_frame_decodes_in_scapy() -> None:
    frame = encode_pfc(bytes.fromhex("020000000001"), {3: 0xFFFF, 6: 0})
    assert len(frame) == 60 and frame[:6] == PFC_DST_MAC
    pkt = Ether(frame)
    cbfc = pkt[MACControlClassBasedFlowControl]
    assert cbfc.c3_enabled == 1 and cbfc.c6_enabled == 1 and cbfc.c0_enabled == 0
    assert cbfc.c3_pause_time == 0xFFFF and cbfc.c6_pause_time == 0
    ours = decode_pfc_untrusted(frame)
    assert ours.class_enable == 0b0100_1000 and ours.quanta[3] == 0xFFFF
    assert ours.pause_seconds(3, 100e9) == pytest.approx(0xFFFF * 512 / 100e9)
    assert isinstance(decode_frame_untrusted(frame), PfcFrame)


GOLDEN = [
    ("uc_send", UC_SEND),
    ("cx4_cnp", CX4_CNP),
    *KINDS,
    ("pfc", encode_pfc(bytes(6), {3: 100})),
]


@pytest.mark.parametrize(("name", "frame"), GOLDEN, ids=[k for k, _ in GOLDEN])
def test_truncated_twin_raises_malformed(name: str, frame: bytes) -> None:
    decode_frame_untrusted(frame)
    # PFC frames carry padding: only cuts into the PFC body are malformed
    end = 34 if name == "pfc" else len(frame)
    for cut in range(end):
        with pytest.raises(MalformedFrame):
            decode_frame_untrusted(frame[:cut])


def test_malformed_reasons_name_field_and_value() -> None:
    frame = bytearray(dict(KINDS)["send_only"])
    frame[-1] ^= 0xFF
    with pytest.raises(MalformedFrame, match="ICRC") as info:
        decode_frame_untrusted(bytes(frame))
    assert info.value.reason == "icrc"
    frame = bytearray(dict(KINDS)["send_only"])
    frame[22] ^= 1  # TTL without fixing the checksum
    with pytest.raises(MalformedFrame, match="checksum") as info:
        decode_frame_untrusted(bytes(frame))
    assert info.value.reason == "ipv4_checksum"
    frame = bytearray(dict(KINDS)["send_only"])
    frame[36:38] = (4792).to_bytes(2, "big")
    with pytest.raises(MalformedFrame, match="4792"):
        decode_frame_untrusted(bytes(frame))
    with pytest.raises(MalformedFrame, match="0x86dd"):
        decode_frame_untrusted(bytes(12) + b"\x86\xdd" + bytes(80))
    with pytest.raises(MalformedFrame, match="VXLAN"):
        decode_datagram_untrusted(bytes(8) + dict(KINDS)["ack"])


def test_psn_arithmetic_wraps() -> None:
    assert psn_add(0xFFFFFF, 1) == 0
    assert psn_diff(0, 0xFFFFFF) == 1
    assert psn_diff(0xFFFFFF, 0) == -1
    assert psn_diff(5, 5) == 0


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=200))
def test_any_bytes_decode_or_raise_malformed(data: bytes) -> None:
    with contextlib.suppress(MalformedFrame):
        decode_datagram_untrusted(data)


@settings(max_examples=400, deadline=None)
@given(st.sampled_from([f for _, f in GOLDEN]), st.data())
def test_mutated_frames_decode_or_raise_malformed(frame: bytes, data: st.DataObject) -> None:
    buf = bytearray(frame)
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(0, len(buf) - 1))
        buf[i] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(0, len(buf)))
    try:
        decode_frame_untrusted(bytes(buf[:cut]))
        decode_frame_untrusted(bytes(buf[:cut]), verify_icrc=False)
    except MalformedFrame:
        pass
