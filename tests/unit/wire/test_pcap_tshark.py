"""Captures our NIC writes are read by Wireshark's own dissectors (tshark)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np
import pytest
from scapy.contrib.roce import BTH
from scapy.layers.l2 import Ether

from rocev2_emu.transport.work import SendWR, Sge, WrOpcode
from rocev2_emu.wire.pcap import PcapWriter, read_pcap
from rocev2_emu.wire.pfc import encode_pfc
from tests.conftest import require_tool
from tests.unit.stepper import Stepper

pytestmark = pytest.mark.tshark


def _capture(path: Path) -> tuple[Stepper, int]:
    s = Stepper(mtu=1024, psn=(0x100, 0x200))
    src = np.arange(3000, dtype=np.uint8)
    dst = np.zeros(3000, dtype=np.uint8)
    ma, mb = s.reg(s.a, src), s.reg(s.b, dst)
    s.a.nic.post_send(
        s.a.qp,
        SendWR(
            1, WrOpcode.RDMA_WRITE, [Sge(ma.addr, 3000, ma.lkey)], remote_addr=mb.addr, rkey=mb.rkey
        ),
    )
    s.a.nic.post_send(
        s.a.qp,
        SendWR(
            2, WrOpcode.RDMA_READ, [Sge(ma.addr, 8, ma.lkey)], remote_addr=mb.addr, rkey=mb.rkey
        ),
    )
    s.run(lambda: len(s.a.cq.entries) == 2)
    writer = PcapWriter(path)
    frames = sorted(
        [(i, d) for i, d in enumerate(s.sent[0])] + [(i + 0.5, d) for i, d in enumerate(s.sent[1])]
    )
    for k, (_, d) in enumerate(frames):
        writer.write(k * 1e-6, d[8:])
    writer.write(1e-3, encode_pfc(s.a.nic.mac, {3: 0xFFFF}))
    bad = bytearray(s.sent[0][0][8:])
    bad[-20] ^= 0x01  # one payload bit flipped: the ICRC no longer matches
    writer.write(2e-3, bytes(bad))
    writer.close()
    return s, len(frames)


def test_pcap_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "x.pcap"
    _, n = _capture(path)
    records = read_pcap(path)
    assert len(records) == n + 2
    assert records[1][0] == pytest.approx(1e-6)


def _tshark(path: Path, *fields: str, display: str) -> list[list[str]]:
    tshark = require_tool("tshark", "apt-get install tshark")
    args = [
        tshark,
        "-r",
        str(path),
        "-o",
        "ip.check_checksum:TRUE",
        "-Y",
        display,
        "-T",
        "fields",
        "-E",
        "separator=|",
    ]
    for f in fields:
        args += ["-e", f]
    out = subprocess.run(args, capture_output=True, text=True, check=True, timeout=60).stdout
    return [line.split("|") for line in out.splitlines()]


def test_tshark_decodes_roce_opcodes_psns_qpns_icrc_and_pfc(tmp_path: Path) -> None:
    path = tmp_path / "roce.pcap"
    s, n = _capture(path)
    rows = _tshark(
        path,
        "frame.number",
        "infiniband.bth.opcode",
        "infiniband.bth.psn",
        "infiniband.bth.destqp",
        "infiniband.invariant.crc",
        "ip.checksum.status",
        display="infiniband",
    )
    assert len(rows) == n + 1
    opcodes = {int(r[1]) for r in rows}
    # RDMA WRITE First/Middle/Last, ACK, READ request and READ response only
    assert {6, 7, 8, 17, 12, 16} <= opcodes
    psns = [int(r[2]) for r in rows[:-1] if r[1] in ("6", "7", "8")]
    assert psns == [0x100, 0x101, 0x102]
    assert {int(r[3], 16) for r in rows if r[1] == "6"} == {s.b.qp.qpn}
    assert all(r[5] == "1" for r in rows)  # IPv4 header checksum good
    # Wireshark 4.0 shows the ICRC it read; check it against scapy's own computation:
    # the good frames match, the corrupted one (the last) does not.
    records = read_pcap(path)
    infiniband = [rec for rec in records if rec[1][12:14] == b"\x08\x00"]
    for row, (_, frame) in zip(rows, infiniband, strict=True):
        pkt = Ether(frame)
        del pkt[BTH].icrc
        expected = Ether(bytes(pkt))[BTH].icrc
        assert (int(row[4], 16) == expected) == (row is not rows[-1])
    pfc = _tshark(
        path, "macc.opcode", "macc.cbfc.enbv.c3", "macc.cbfc.pause_time.c3", display="macc"
    )
    assert pfc == [["0x0101", "1", "65535"]]
