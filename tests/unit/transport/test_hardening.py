"""What a careless or hostile peer sends, counted and refused where the spec says so."""

from __future__ import annotations

import numpy as np

from rocev2_emu.topology.generate import single_switch
from rocev2_emu.transport.work import SendWR, Sge, WcStatus, WorkCompletion, WrOpcode
from rocev2_emu.wire.bth import Opcode
from rocev2_emu.wire.ethernet import encode_vxlan
from rocev2_emu.wire.pfc import encode_pfc
from rocev2_emu.wire.roce import FrameTemplate, pack_aeth, pack_reth
from tests.unit.netsim import NetSim
from tests.unit.stepper import Stepper, gather
from tests.unit.switch.test_switch import topo


def test_a_reserved_aeth_syndrome_acknowledges_nothing() -> None:
    s = Stepper(mtu=1024, link_bps=0)  # unpaced: all four packets leave at once
    src, dst = np.zeros(4096, np.uint8), np.zeros(4096, np.uint8)
    ma, mb = s.reg(s.a, src), s.reg(s.b, dst)
    wr = SendWR(1, WrOpcode.RDMA_WRITE, [Sge(ma.addr, 4096, ma.lkey)], rkey=mb.rkey)
    s.a.nic.post_send(s.a.qp, wr)
    while s.a.nic.next_datagram(0.0) is not None:  # the four packets leave; none is acked
        pass
    una = s.a.qp.requester.una
    tpl = s.template(s.a, s.b)
    last = (una + 3) & 0xFFFFFF
    for syndrome in (0x40, 0x80, 0xC0):  # type 10, and the reserved top bit
        forged = tpl.build(
            Opcode.RC_ACKNOWLEDGE, dqpn=s.a.qp.qpn, psn=last, ext=pack_aeth(syndrome, 1)
        )
        s.a.nic.receive_datagram(bytes(forged), 0.0)
    assert s.a.qp.requester.una == una  # nothing was acknowledged
    assert s.a.nic.counters.rx_drops["reserved_aeth_syndrome"] == 3
    assert s.a.cq.poll(8) == []  # and nothing completed


def test_runts_count_as_packets_never_as_negative_bytes() -> None:
    s = Stepper()
    sim = NetSim(topo(single_switch(2)))
    sw = sim.switches["sw0"]
    for runt in (b"", b"\x08", b"\x08\x00\x00\x00\x00\x00\x01"):
        s.a.nic.receive_datagram(runt, 0.0)
        sw.receive(0, runt, 0.0)
    assert s.a.nic.counters.rx_packets == 3 and s.a.nic.counters.rx_bytes == 0
    assert sw.ports[0].rx_packets == 3 and sw.ports[0].rx_bytes == 0


def test_a_pfc_frame_that_enables_no_class_is_counted() -> None:
    s = Stepper()
    sim = NetSim(topo(single_switch(2)))
    sw = sim.switches["sw0"]
    empty = encode_vxlan(2, encode_pfc(bytes(6), {}))
    sw.receive(1, empty, 0.0)
    s.a.nic.receive_datagram(empty, 0.0)
    assert sw.ports[1].drops["pfc_no_class_enabled"] == 1
    assert s.a.nic.counters.rx_drops["pfc_no_class_enabled"] == 1
    assert not any(sw.ports[1].pfc_rx) and not any(s.a.nic.pause_frames_received)


def test_deregistering_an_mr_revokes_a_write_in_progress() -> None:
    s = Stepper(mtu=1024)
    src, dst = np.full(65536, 7, np.uint8), np.zeros(65536, np.uint8)
    ma, mb = s.reg(s.a, src), s.reg(s.b, dst)
    sge = [Sge(ma.addr, 65536, ma.lkey)]
    wr = SendWR(1, WrOpcode.RDMA_WRITE, sge, remote_addr=mb.addr, rkey=mb.rkey)
    s.a.nic.post_send(s.a.qp, wr)
    s.run(lambda: s.b.qp.responder.rx_bytes >= 8192)  # the WRITE is under way
    s.b.nic.dereg_mr(mb)
    landed = int(np.count_nonzero(dst))
    got: list[WorkCompletion] = []
    s.run(lambda: gather(got, s.a.completions()) > 0)
    (wc,) = got
    assert wc.status is WcStatus.REM_ACCESS_ERR  # the spec's error, not SUCCESS
    assert int(np.count_nonzero(dst)) == landed  # nothing written after the revocation
    assert landed < 65536 and s.b.nic.counters.resp_remote_access_errors == 1


def _from(s: Stepper, src_ip: int, to_a: bool) -> FrameTemplate:
    return s.template(s.a if to_a else s.b, src_ip=src_ip)


def test_a_write_from_anyone_but_the_peer_is_dropped_not_written() -> None:
    s = Stepper()
    dst = np.zeros(64, np.uint8)
    mb = s.reg(s.b, dst)
    spoofed = _from(s, 0x0A090909, to_a=False)  # 10.9.9.9, not h a
    ext = pack_reth(mb.addr, mb.rkey, 64)
    psn = s.b.qp.responder.epsn
    frame = spoofed.build(
        Opcode.RC_RDMA_WRITE_ONLY, dqpn=s.b.qp.qpn, psn=psn, ext=ext, payload=b"\x01" * 64
    )
    s.b.nic.receive_datagram(bytes(frame), 0.0)
    assert not dst.any() and s.b.nic.counters.rx_drops["wrong_src_ip"] == 1
    assert s.b.nic.next_datagram(0.0) is None  # and not acknowledged
    # the right source with a wrong partition key is refused too
    wrong_key = _from(s, s.a.nic.ip, to_a=False).build(
        Opcode.RC_RDMA_WRITE_ONLY,
        dqpn=s.b.qp.qpn,
        psn=psn,
        ext=ext,
        payload=b"\x01" * 64,
        pkey=0x1234,
    )
    s.b.nic.receive_datagram(bytes(wrong_key), 0.0)
    assert not dst.any() and s.b.nic.counters.rx_drops["bad_pkey"] == 1


def test_a_forged_ack_completes_nothing() -> None:
    s = Stepper(link_bps=0)
    src, dst = np.ones(4096, np.uint8), np.zeros(4096, np.uint8)
    ma, mb = s.reg(s.a, src), s.reg(s.b, dst)
    wr = SendWR(
        1, WrOpcode.RDMA_WRITE, [Sge(ma.addr, 4096, ma.lkey)], remote_addr=mb.addr, rkey=mb.rkey
    )
    s.a.nic.post_send(s.a.qp, wr)
    while s.a.nic.next_datagram(0.0) is not None:  # sent, and lost: nothing reaches b
        pass
    una = s.a.qp.requester.una
    forged = _from(s, 0x0A090909, to_a=True).build(
        Opcode.RC_ACKNOWLEDGE, dqpn=s.a.qp.qpn, psn=(una + 3) & 0xFFFFFF, ext=pack_aeth(0, 1)
    )
    s.a.nic.receive_datagram(bytes(forged), 0.0)
    assert s.a.qp.requester.una == una and s.a.cq.poll(8) == []  # no false SUCCESS
    assert s.a.nic.counters.rx_drops["wrong_src_ip"] == 1
