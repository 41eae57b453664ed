"""The RC transport in virtual time: two sans-IO NICs, a hand-stepped clock, a scripted wire."""

from __future__ import annotations

import itertools
from collections.abc import Callable

import numpy as np
import pytest

from rocev2_emu.transport.errors import LocalVerbsError
from rocev2_emu.transport.memory import Access
from rocev2_emu.transport.qp_state import QPAttr, QPState, local_ack_timeout, rnr_delay
from rocev2_emu.transport.work import RecvWR, SendFlags, SendWR, Sge, WcOpcode, WcStatus, WrOpcode
from rocev2_emu.wire.bth import Opcode, psn_add
from rocev2_emu.wire.roce import RoceFrame, pack_reth
from tests.unit.stepper import Stepper, decode, gather

RW = Access.LOCAL_WRITE | Access.REMOTE_WRITE | Access.REMOTE_READ | Access.REMOTE_ATOMIC


def pattern(n: int, seed: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8)


def drop_once(
    pred: Callable[[int, RoceFrame], bool],
) -> Callable[[int, bytes, float], list[bytes]]:
    """A tamper that drops the first datagram for which ``pred(side, frame)`` holds."""
    done: list[float] = []

    def tamper(side: int, data: bytes, now: float) -> list[bytes]:
        if not done and pred(side, decode(data)):
            done.append(now)
            return []
        return [data]

    return tamper


def write(s: Stepper, n: int, *, wr_id: int = 1, seed: int = 1) -> tuple[np.ndarray, np.ndarray]:
    src, dst = pattern(n, seed), np.zeros(n, dtype=np.uint8)
    ma, mb = s.reg(s.a, src), s.reg(s.b, dst)
    s.a.nic.post_send(
        s.a.qp,
        SendWR(
            wr_id,
            WrOpcode.RDMA_WRITE,
            [Sge(ma.addr, n, ma.lkey)],
            remote_addr=mb.addr,
            rkey=mb.rkey,
        ),
    )
    return src, dst


def run_until_completions(s: Stepper, n: int = 1, max_time: float = 10.0) -> list:  # type: ignore[type-arg]
    got: list = []  # type: ignore[type-arg]
    s.run(lambda: gather(got, s.a.completions()) >= n, max_time=max_time)
    return got


# -- operations -------------------------------------------------------------------------------


def test_write_read_send_with_imm_and_atomics() -> None:
    s = Stepper(mtu=1024)
    a_buf, b_buf = pattern(10000, 1), pattern(10000, 2)
    a0, b0 = a_buf.copy(), b_buf.copy()
    ma, mb = s.reg(s.a, a_buf), s.reg(s.b, b_buf)
    s.b.nic.post_recv(s.b.qp, RecvWR(77, [Sge(mb.addr + 8000, 2000, mb.lkey)]))
    s.b.nic.post_recv(s.b.qp, RecvWR(78, [Sge(mb.addr, 8, mb.lkey)]))
    s.a.nic.post_send(
        s.a.qp,
        SendWR(
            1,
            WrOpcode.RDMA_WRITE,
            [Sge(ma.addr, 3000, ma.lkey)],
            remote_addr=mb.addr + 100,
            rkey=mb.rkey,
        ),
    )
    s.a.nic.post_send(
        s.a.qp,
        SendWR(
            2,
            WrOpcode.RDMA_READ,
            [Sge(ma.addr + 5000, 2500, ma.lkey)],
            remote_addr=mb.addr + 5000,
            rkey=mb.rkey,
        ),
    )
    s.a.nic.post_send(
        s.a.qp,
        SendWR(
            3,
            WrOpcode.SEND_WITH_IMM,
            [Sge(ma.addr, 1000, ma.lkey), Sge(ma.addr + 9000, 900, ma.lkey)],
            imm_data=0xCAFE,
        ),
    )
    cell = 9992  # 8-aligned offset in b for atomics
    b_buf[cell : cell + 8] = np.frombuffer((40).to_bytes(8, "little"), dtype=np.uint8)
    s.a.nic.post_send(
        s.a.qp,
        SendWR(
            4,
            WrOpcode.ATOMIC_FETCH_AND_ADD,
            [Sge(ma.addr + 9990 - 6, 8, ma.lkey)],
            remote_addr=mb.addr + cell,
            rkey=mb.rkey,
            compare_add=2,
        ),
    )
    s.a.nic.post_send(
        s.a.qp,
        SendWR(
            5,
            WrOpcode.ATOMIC_CMP_AND_SWP,
            [Sge(ma.addr + 16, 8, ma.lkey)],
            remote_addr=mb.addr + cell,
            rkey=mb.rkey,
            compare_add=42,
            swap=7,
        ),
    )
    s.a.nic.post_send(
        s.a.qp,
        SendWR(
            6,
            WrOpcode.RDMA_WRITE_WITH_IMM,
            [Sge(ma.addr, 5, ma.lkey)],
            remote_addr=mb.addr + 20,
            rkey=mb.rkey,
            imm_data=5,
        ),
    )
    wcs = run_until_completions(s, 6)
    assert [(w.wr_id, w.status, w.opcode) for w in wcs] == [
        (1, WcStatus.SUCCESS, WcOpcode.RDMA_WRITE),
        (2, WcStatus.SUCCESS, WcOpcode.RDMA_READ),
        (3, WcStatus.SUCCESS, WcOpcode.SEND),
        (4, WcStatus.SUCCESS, WcOpcode.FETCH_ADD),
        (5, WcStatus.SUCCESS, WcOpcode.COMP_SWAP),
        (6, WcStatus.SUCCESS, WcOpcode.RDMA_WRITE),
    ]
    assert (b_buf[100:3100] == a0[:3000]).all()
    assert (a_buf[5000:7500] == b0[5000:7500]).all()
    assert (b_buf[8000:9000] == a0[:1000]).all() and (b_buf[9000:9900] == a0[9000:9900]).all()
    assert int.from_bytes(a_buf[9984:9992].tobytes(), "little") == 40
    assert int.from_bytes(a_buf[16:24].tobytes(), "little") == 42
    assert int.from_bytes(b_buf[cell : cell + 8].tobytes(), "little") == 7
    recv = s.b.completions()
    assert [(w.wr_id, w.opcode, w.byte_len, w.imm_data) for w in recv] == [
        (77, WcOpcode.RECV, 1900, 0xCAFE),
        (78, WcOpcode.RECV_RDMA_WITH_IMM, 5, 5),
    ]
    assert s.a.nic.counters.retransmitted_packets == 0


def test_segmentation_by_path_mtu_and_ack_coalescing() -> None:
    for mtu in (256, 512, 1024, 2048, 4096):
        s = Stepper(mtu=mtu)
        src, dst = write(s, 100_000)
        run_until_completions(s)
        assert (src == dst).all()
        data = [decode(d) for d in s.sent[0]]
        assert len(data) == -(-100_000 // mtu)
        assert all(len(f.payload) == mtu for f in data[:-1])
        assert [f.opcode for f in data[:2]] == [
            Opcode.RC_RDMA_WRITE_FIRST,
            Opcode.RC_RDMA_WRITE_MIDDLE,
        ]
        assert data[-1].opcode == Opcode.RC_RDMA_WRITE_LAST and data[-1].ackreq
        acks = [decode(d) for d in s.sent[1]]
        assert all(a.opcode == Opcode.RC_ACKNOWLEDGE for a in acks)
        assert len(acks) < len(data) / 8 + 2  # AckReq every 16 packets, coalesced


def test_psn_wraps_at_24_bits() -> None:
    s = Stepper(mtu=256, psn=(0xFFFFFA, 0xFFFFFC))
    src, dst = write(s, 256 * 20)
    s.a.nic.post_send(
        s.a.qp,
        SendWR(
            2,
            WrOpcode.RDMA_READ,
            [Sge(s.a.mrs[0].addr, 256 * 12, s.a.mrs[0].lkey)],
            remote_addr=s.b.mrs[0].addr,
            rkey=s.b.mrs[0].rkey,
        ),
    )
    wcs = run_until_completions(s, 2)
    assert all(w.status is WcStatus.SUCCESS for w in wcs)
    psns = [decode(d).psn for d in s.sent[0]]
    assert psns[:7] == [0xFFFFFA, 0xFFFFFB, 0xFFFFFC, 0xFFFFFD, 0xFFFFFE, 0xFFFFFF, 0]
    assert (src == dst).all()
    assert s.a.nic.counters.retransmitted_packets == 0


@pytest.mark.parametrize("which", ["first", "middle", "last"])
def test_loss_of_a_packet_is_recovered_by_go_back_n(which: str) -> None:
    start = 1000
    k = {"first": 0, "middle": 5, "last": 9}[which]
    s = Stepper(
        mtu=1024,
        psn=(start, 5000),
        timeout=8,
        tamper=drop_once(lambda side, f: side == 0 and f.psn == start + k),
    )
    src, dst = write(s, 10 * 1024)
    wcs = run_until_completions(s)
    assert wcs[0].status is WcStatus.SUCCESS and (src == dst).all()
    c = s.a.nic.counters
    if which == "last":  # nothing follows it: only the ACK timer notices
        assert (c.local_ack_timeout_err, c.packet_seq_err) == (1, 0)
        assert s.now >= local_ack_timeout(8)  # type: ignore[operator]
        # no earlier packet asked for an ACK, so go-back-N resends all ten; the nine that
        # had arrived are duplicates to the responder, which re-acknowledges them
        assert c.retransmitted_packets == 10
        assert s.b.nic.counters.duplicate_request == 9
    else:  # the next packet is out of sequence: one NAK, resend from the lost PSN
        assert (c.local_ack_timeout_err, c.packet_seq_err) == (0, 1)
        assert s.b.nic.counters.out_of_sequence == 9 - k
        assert c.retransmitted_packets == 10 - k
        naks = [decode(d) for d in s.sent[1] if decode(d).aeth.syndrome == 0x60]  # type: ignore[union-attr]
        assert [n.psn for n in naks] == [start + k]  # exactly one NAK, naming the lost PSN


def test_lost_ack_is_recovered_by_timeout_and_duplicate_reack() -> None:
    s = Stepper(
        mtu=1024,
        timeout=8,
        tamper=drop_once(lambda side, f: side == 1 and f.opcode == Opcode.RC_ACKNOWLEDGE),
    )
    src, dst = write(s, 2048)
    wcs = run_until_completions(s)
    assert [w.status for w in wcs] == [WcStatus.SUCCESS] and (src == dst).all()
    assert s.a.nic.counters.local_ack_timeout_err == 1
    assert s.b.nic.counters.duplicate_request == 2  # both packets came again, re-ACKed
    assert len(s.b.completions()) == 0


def test_lost_nak_is_recovered_by_timeout() -> None:
    def pred(side: int, f: object) -> bool:
        return side == 1 and f.aeth is not None and f.aeth.syndrome == 0x60  # type: ignore[attr-defined]

    s = Stepper(mtu=1024, psn=(10, 20), timeout=8, tamper=None)
    lost_data = drop_once(lambda side, f: side == 0 and f.psn == 12)
    lost_nak = drop_once(pred)
    s.tamper = lambda side, d, now: [
        x for y in lost_data(side, d, now) for x in lost_nak(side, y, now)
    ]
    src, dst = write(s, 8 * 1024)
    run_until_completions(s)
    assert (src == dst).all()
    c = s.a.nic.counters
    assert (c.packet_seq_err, c.local_ack_timeout_err) == (0, 1)
    assert s.b.nic.counters.out_of_sequence == 5  # one NAK episode, then silent drops


def test_reordering_and_duplication() -> None:
    held: list[bytes] = []

    def tamper(side: int, data: bytes, now: float) -> list[bytes]:
        f = decode(data)
        if side == 0 and f.psn == 3 and not held:
            held.append(data)
            return []
        if side == 0 and f.psn == 5 and held:
            return [data, held.pop(), data]
        return [data]

    s = Stepper(mtu=512, psn=(0, 0), tamper=tamper)
    src, dst = write(s, 512 * 10)
    assert run_until_completions(s)[0].status is WcStatus.SUCCESS
    assert (src == dst).all()
    assert s.b.nic.counters.duplicate_request >= 1


def test_duplicate_read_is_replayed() -> None:
    def tamper(side: int, data: bytes, now: float) -> list[bytes]:
        return [data, data] if decode(data).opcode == Opcode.RC_RDMA_READ_REQUEST else [data]

    s = Stepper(mtu=1024, tamper=tamper)
    local, remote = np.zeros(5000, dtype=np.uint8), pattern(5000)
    ma, mb = s.reg(s.a, local), s.reg(s.b, remote)
    s.a.nic.post_send(
        s.a.qp,
        SendWR(
            1, WrOpcode.RDMA_READ, [Sge(ma.addr, 5000, ma.lkey)], remote_addr=mb.addr, rkey=mb.rkey
        ),
    )
    wcs = run_until_completions(s)
    assert wcs[0].status is WcStatus.SUCCESS and (local == remote).all()
    assert s.b.nic.counters.duplicate_request == 1
    assert s.b.nic.counters.rx_read_requests == 1  # executed once, replayed once
    # the duplicate restarts the answer (as rxe reuses the resource): 5 to 10 packets
    assert 5 <= len(s.sent[1]) <= 10


def test_read_request_retried_after_lost_response_is_replayed() -> None:
    s = Stepper(
        mtu=1024,
        timeout=8,
        tamper=drop_once(
            lambda side, f: side == 1 and f.opcode == Opcode.RC_RDMA_READ_RESPONSE_ONLY
        ),
    )
    local, remote = np.zeros(1000, dtype=np.uint8), pattern(1000)
    ma, mb = s.reg(s.a, local), s.reg(s.b, remote)
    s.a.nic.post_send(
        s.a.qp,
        SendWR(
            1, WrOpcode.RDMA_READ, [Sge(ma.addr, 1000, ma.lkey)], remote_addr=mb.addr, rkey=mb.rkey
        ),
    )
    wcs = run_until_completions(s)
    assert wcs[0].status is WcStatus.SUCCESS and (local == remote).all()
    assert s.a.nic.counters.local_ack_timeout_err == 1
    assert s.b.nic.counters.duplicate_request == 1  # the retried READ, answered again
    assert s.b.nic.counters.rx_read_requests == 1


def test_duplicate_atomic_is_answered_from_saved_result_never_reexecuted() -> None:
    # Lose the first atomic ACK: the requester times out and sends the FETCH_ADD again.
    s = Stepper(
        mtu=1024,
        timeout=8,
        tamper=drop_once(lambda side, f: side == 1 and f.opcode == Opcode.RC_ATOMIC_ACKNOWLEDGE),
    )
    local, remote = np.zeros(8, dtype=np.uint8), np.zeros(8, dtype=np.uint8)
    remote[:] = np.frombuffer((100).to_bytes(8, "little"), dtype=np.uint8)
    ma, mb = s.reg(s.a, local), s.reg(s.b, remote)
    s.a.nic.post_send(
        s.a.qp,
        SendWR(
            1,
            WrOpcode.ATOMIC_FETCH_AND_ADD,
            [Sge(ma.addr, 8, ma.lkey)],
            remote_addr=mb.addr,
            rkey=mb.rkey,
            compare_add=5,
        ),
    )
    wcs = run_until_completions(s)
    assert wcs[0].status is WcStatus.SUCCESS
    assert int.from_bytes(remote.tobytes(), "little") == 105  # added once
    assert int.from_bytes(local.tobytes(), "little") == 100
    assert s.b.nic.counters.duplicate_request == 1
    assert s.b.nic.counters.rx_atomic_requests == 1


# -- RNR --------------------------------------------------------------------------------------


def test_rnr_with_rnr_retry_0_fails_and_flushes() -> None:
    s = Stepper(mtu=1024, rnr_retry=0, min_rnr_timer=1)
    buf = pattern(100)
    ma = s.reg(s.a, buf)
    for i in range(3):
        s.a.nic.post_send(s.a.qp, SendWR(i, WrOpcode.SEND, [Sge(ma.addr, 10, ma.lkey)]))
    wcs = run_until_completions(s, 3)
    assert [w.status for w in wcs] == [
        WcStatus.RNR_RETRY_EXC_ERR,
        WcStatus.WR_FLUSH_ERR,
        WcStatus.WR_FLUSH_ERR,
    ]
    assert s.a.qp.state is QPState.ERR
    assert s.a.nic.counters.rnr_nak_received == 1 and s.b.nic.counters.out_of_buffer == 1


def test_rnr_with_rnr_retry_7_waits_until_a_receive_is_posted() -> None:
    s = Stepper(mtu=1024, rnr_retry=7, min_rnr_timer=14, delay=1e-6)  # RNR delay 1.28 ms
    src, dst = pattern(3000), np.zeros(3000, dtype=np.uint8)
    ma, mb = s.reg(s.a, src), s.reg(s.b, dst)
    s.a.nic.post_send(s.a.qp, SendWR(1, WrOpcode.SEND, [Sge(ma.addr, 3000, ma.lkey)]))
    s.advance_to(rnr_delay(14) * 3.2)
    naks = s.a.nic.counters.rnr_nak_received
    assert naks == 4  # the first try and one retry per RNR delay (~1.28 ms)
    s.b.nic.post_recv(s.b.qp, RecvWR(9, [Sge(mb.addr, 3000, mb.lkey)]))
    wcs = run_until_completions(s)
    assert wcs[0].status is WcStatus.SUCCESS and (src == dst).all()
    assert s.b.completions()[0].byte_len == 3000


# -- retry exhaustion -------------------------------------------------------------------------


def test_retry_exhaustion_completes_with_retry_exceeded_and_flushes_the_rest() -> None:
    s = Stepper(
        mtu=1024, timeout=5, retry_cnt=2, tamper=lambda side, d, now: [] if side == 0 else [d]
    )
    ma = s.reg(s.a, pattern(4096))
    mb = s.reg(s.b, np.zeros(4096, dtype=np.uint8))
    for i in range(3):
        s.a.nic.post_send(
            s.a.qp,
            SendWR(
                i,
                WrOpcode.RDMA_WRITE,
                [Sge(ma.addr, 1000, ma.lkey)],
                remote_addr=mb.addr,
                rkey=mb.rkey,
            ),
        )
    wcs = run_until_completions(s, 3)
    assert [(w.wr_id, w.status) for w in wcs] == [
        (0, WcStatus.RETRY_EXC_ERR),
        (1, WcStatus.WR_FLUSH_ERR),
        (2, WcStatus.WR_FLUSH_ERR),
    ]
    assert s.a.qp.state is QPState.ERR
    t = local_ack_timeout(5)
    assert t == pytest.approx(4.096e-6 * 32)
    # first transmission near 0, then timeouts at T, 2T, 3T; the third finds no retry left
    assert t is not None and s.now == pytest.approx(3 * t, abs=1e-6)
    assert s.a.nic.counters.local_ack_timeout_err == 3
    assert s.a.nic.counters.retransmitted_packets == 2 * 3
    # a post on the ERR QP completes at once with a flush error
    s.a.nic.post_send(s.a.qp, SendWR(9, WrOpcode.SEND, [Sge(ma.addr, 1, ma.lkey)]))
    assert s.a.completions()[0].status is WcStatus.WR_FLUSH_ERR


# -- remote access checks ---------------------------------------------------------------------


@pytest.mark.parametrize("fault", ["bad_rkey", "out_of_bounds", "missing_access", "other_pd"])
def test_remote_access_errors_leave_memory_untouched(fault: str) -> None:
    s = Stepper(mtu=1024)
    src, dst = pattern(5000), pattern(5000, seed=9)
    before = dst.copy()
    ma = s.reg(s.a, src)
    access = Access.LOCAL_WRITE | Access.REMOTE_READ if fault == "missing_access" else RW
    if fault == "other_pd":
        mb = s.b.nic.reg_mr(s.b.nic.alloc_pd(), dst, RW)
    else:
        mb = s.reg(s.b, dst, access)
    rkey = mb.rkey ^ 0x5A5A if fault == "bad_rkey" else mb.rkey
    length = 5000 if fault != "out_of_bounds" else 4000
    addr = mb.addr + (0 if fault != "out_of_bounds" else 1001)
    s.a.nic.post_send(
        s.a.qp,
        SendWR(
            1, WrOpcode.RDMA_WRITE, [Sge(ma.addr, length, ma.lkey)], remote_addr=addr, rkey=rkey
        ),
    )
    s.a.nic.post_send(s.a.qp, SendWR(2, WrOpcode.SEND, [Sge(ma.addr, 10, ma.lkey)]))
    wcs = run_until_completions(s, 2)
    assert [w.status for w in wcs] == [WcStatus.REM_ACCESS_ERR, WcStatus.WR_FLUSH_ERR]
    assert (dst == before).all()
    assert s.a.qp.state is QPState.ERR and s.b.qp.state is QPState.ERR
    assert s.b.nic.counters.resp_remote_access_errors == 1
    assert s.a.nic.counters.req_remote_access_errors == 1


def test_read_of_deregistered_memory_is_refused() -> None:
    s = Stepper(mtu=1024)
    ma = s.reg(s.a, np.zeros(100, dtype=np.uint8))
    mb = s.reg(s.b, pattern(100))
    s.b.nic.dereg_mr(mb)
    s.a.nic.post_send(
        s.a.qp,
        SendWR(
            1, WrOpcode.RDMA_READ, [Sge(ma.addr, 100, ma.lkey)], remote_addr=mb.addr, rkey=mb.rkey
        ),
    )
    assert run_until_completions(s)[0].status is WcStatus.REM_ACCESS_ERR
    assert not s.a.mrs[0].buffer.tobytes().strip(b"\0")


def test_invalid_opcode_sequence_gets_invalid_request_nak() -> None:
    s = Stepper(mtu=1024, psn=(0, 50))
    mb = s.reg(s.b, np.zeros(4096, dtype=np.uint8))
    tpl = s.template(s.b, s.a)
    # a WRITE MIDDLE with the expected PSN but no WRITE FIRST before it
    bogus = tpl.build(Opcode.RC_RDMA_WRITE_MIDDLE, dqpn=s.b.qp.qpn, psn=0, payload=bytes(1024))
    s.b.nic.receive_datagram(bytes(bogus), 0.0)
    assert s.b.qp.state is QPState.ERR
    nak = decode(bytes(s.b.nic.next_datagram(0.0) or b""))
    assert nak.opcode == Opcode.RC_ACKNOWLEDGE and nak.aeth is not None
    assert nak.aeth.syndrome == 0x60 | 1 and nak.psn == 0
    assert s.b.nic.counters.resp_invalid_request == 1
    # a first packet that announces more than it sends is also an invalid request
    s2 = Stepper(mtu=1024, psn=(0, 50))
    mb = s2.reg(s2.b, np.zeros(4096, dtype=np.uint8))
    only = tpl.build(
        Opcode.RC_RDMA_WRITE_ONLY,
        dqpn=s2.b.qp.qpn,
        psn=0,
        ext=pack_reth(mb.addr, mb.rkey, 4000),
        payload=bytes(100),
    )
    s2.b.nic.receive_datagram(bytes(only), 0.0)
    assert s2.b.qp.state is QPState.ERR


# -- local errors and the state machine -------------------------------------------------------


def test_local_misuse_raises() -> None:
    s = Stepper()
    ma = s.reg(s.a, np.zeros(64, dtype=np.uint8))
    nic = s.a.nic
    qp = nic.create_qp(s.a.pd, s.a.cq, s.a.cq)  # type: ignore[arg-type]
    wr = SendWR(1, WrOpcode.SEND, [Sge(ma.addr, 8, ma.lkey)])
    with pytest.raises(LocalVerbsError, match="RESET"):
        nic.post_send(qp, wr)
    with pytest.raises(LocalVerbsError, match="RESET"):
        nic.post_recv(qp, RecvWR(1, [Sge(ma.addr, 8, ma.lkey)]))
    with pytest.raises(LocalVerbsError, match="requires"):
        nic.modify_qp(qp, QPAttr(qp_state=QPState.INIT, port_num=1))
    nic.modify_qp(qp, QPAttr(qp_state=QPState.INIT, port_num=1, qp_access_flags=RW))
    with pytest.raises(LocalVerbsError, match="INIT"):
        nic.post_send(qp, wr)
    with pytest.raises(LocalVerbsError, match="does not allow"):
        nic.modify_qp(
            qp,
            QPAttr(
                qp_state=QPState.RTR,
                path_mtu=1024,
                dest_qp_num=5,
                rq_psn=0,
                max_dest_rd_atomic=1,
                min_rnr_timer=1,
                ah_attr="10.0.0.2",
                sq_psn=3,
            ),
        )
    with pytest.raises(LocalVerbsError, match="path_mtu"):
        nic.modify_qp(
            qp,
            QPAttr(
                qp_state=QPState.RTR,
                path_mtu=1500,
                dest_qp_num=5,
                rq_psn=0,
                max_dest_rd_atomic=1,
                min_rnr_timer=1,
                ah_attr="10.0.0.2",
            ),
        )
    with pytest.raises(LocalVerbsError, match="no QP transition"):
        nic.modify_qp(
            qp,
            QPAttr(
                qp_state=QPState.RTS, sq_psn=0, timeout=1, retry_cnt=1, rnr_retry=1, max_rd_atomic=1
            ),
        )
    # an SGE outside its MR, an unknown lkey, a misaligned atomic
    for bad in (Sge(ma.addr + 60, 8, ma.lkey), Sge(ma.addr, 8, ma.lkey ^ 1)):
        with pytest.raises(LocalVerbsError, match="sg_list"):
            s.a.nic.post_send(s.a.qp, SendWR(1, WrOpcode.SEND, [bad]))
    with pytest.raises(LocalVerbsError, match="aligned"):
        s.a.nic.post_send(
            s.a.qp,
            SendWR(
                1, WrOpcode.ATOMIC_FETCH_AND_ADD, [Sge(ma.addr, 8, ma.lkey)], remote_addr=4, rkey=1
            ),
        )
    with pytest.raises(LocalVerbsError, match="imm_data"):
        s.a.nic.post_send(s.a.qp, SendWR(1, WrOpcode.SEND_WITH_IMM, [Sge(ma.addr, 8, ma.lkey)]))
    ro = s.a.nic.reg_mr(s.a.pd, np.zeros(8, dtype=np.uint8), Access.NONE)  # type: ignore[arg-type]
    with pytest.raises(LocalVerbsError, match="LOCAL_WRITE"):
        s.a.nic.post_recv(s.a.qp, RecvWR(1, [Sge(ro.addr, 8, ro.lkey)]))
    with pytest.raises(LocalVerbsError, match="read-only"):
        s.a.nic.reg_mr(s.a.pd, b"immutable", Access.NONE)  # type: ignore[arg-type]


def test_posted_receives_are_flushed_on_error() -> None:
    s = Stepper()
    mb = s.reg(s.b, np.zeros(64, dtype=np.uint8))
    s.b.nic.post_recv(s.b.qp, RecvWR(1, [Sge(mb.addr, 8, mb.lkey)]))
    s.b.nic.post_recv(s.b.qp, RecvWR(2, [Sge(mb.addr, 8, mb.lkey)]))
    s.b.nic.modify_qp(s.b.qp, QPAttr(qp_state=QPState.ERR))
    assert [(w.wr_id, w.status) for w in s.b.completions()] == [
        (1, WcStatus.WR_FLUSH_ERR),
        (2, WcStatus.WR_FLUSH_ERR),
    ]


def test_sqd_holds_new_requests_until_rts() -> None:
    s = Stepper(mtu=1024)
    s.a.nic.modify_qp(s.a.qp, QPAttr(qp_state=QPState.SQD))
    src, dst = write(s, 2000)
    s.advance_to(5e-4)
    assert not s.sent[0] and not (src == dst).all()
    s.a.nic.modify_qp(s.a.qp, QPAttr(qp_state=QPState.RTS))
    assert run_until_completions(s)[0].status is WcStatus.SUCCESS and (src == dst).all()


def test_max_rd_atomic_bounds_outstanding_reads() -> None:
    outstanding = []

    def tamper(side: int, data: bytes, now: float) -> list[bytes]:
        f = decode(data)
        if side == 0 and f.opcode == Opcode.RC_RDMA_READ_REQUEST:
            outstanding.append(1)
        if side == 1 and f.opcode in (
            Opcode.RC_RDMA_READ_RESPONSE_ONLY,
            Opcode.RC_RDMA_READ_RESPONSE_LAST,
        ):
            outstanding.pop()
        peak.append(len(outstanding))
        return [data]

    peak: list[int] = []
    s = Stepper(mtu=1024, max_rd_atomic=2, tamper=tamper)
    ma, mb = s.reg(s.a, np.zeros(8192, dtype=np.uint8)), s.reg(s.b, pattern(8192))
    for i in range(8):
        s.a.nic.post_send(
            s.a.qp,
            SendWR(
                i,
                WrOpcode.RDMA_READ,
                [Sge(ma.addr + 1024 * i, 1024, ma.lkey)],
                remote_addr=mb.addr + 1024 * i,
                rkey=mb.rkey,
            ),
        )
    assert len(run_until_completions(s, 8)) == 8
    assert max(peak) == 2


def test_unsignaled_work_requests_complete_silently() -> None:
    s = Stepper()
    ma, mb = s.reg(s.a, pattern(100)), s.reg(s.b, np.zeros(100, dtype=np.uint8))
    for i, flags in enumerate([SendFlags.NONE, SendFlags.NONE, SendFlags.SIGNALED]):
        s.a.nic.post_send(
            s.a.qp,
            SendWR(
                i,
                WrOpcode.RDMA_WRITE,
                [Sge(ma.addr, 10, ma.lkey)],
                flags,
                remote_addr=mb.addr,
                rkey=mb.rkey,
            ),
        )
    assert [w.wr_id for w in run_until_completions(s)] == [2]
    assert not s.a.qp.requester.wqes


# -- the NIC: drops, PFC, pacing --------------------------------------------------------------


def test_nic_counts_and_drops_bad_frames() -> None:
    s = Stepper()
    nic = s.b.nic
    tpl = s.template(s.b, s.a)
    good = bytes(tpl.build(Opcode.RC_SEND_ONLY, dqpn=s.b.qp.qpn, psn=99, payload=b"x"))
    bad_icrc = bytearray(good)
    bad_icrc[-1] ^= 1
    bad_csum = bytearray(good)
    bad_csum[8 + 14 + 8] ^= 1  # TTL changed without fixing the checksum
    unknown = bytes(tpl.build(Opcode.RC_SEND_ONLY, dqpn=0xABCDE, psn=1))
    for d in (b"\x08" + bytes(40), bytes(bad_icrc), bytes(bad_csum), unknown, good[:30]):
        nic.receive_datagram(d, 0.0)
    qp = nic.create_qp(s.b.pd, s.b.cq, s.b.cq)  # type: ignore[arg-type]
    nic.receive_datagram(bytes(tpl.build(Opcode.RC_SEND_ONLY, dqpn=qp.qpn, psn=1)), 0.0)
    assert dict(nic.counters.rx_drops) == {
        "ethertype": 1,
        "icrc": 1,
        "ipv4_checksum": 1,
        "unknown_qp": 1,
        "truncated": 1,
        "qp_state": 1,
    }


def test_pfc_pause_stops_the_roce_priority_for_quanta_times_512_bit_times() -> None:
    from rocev2_emu.wire.ethernet import encode_vxlan
    from rocev2_emu.wire.pfc import encode_pfc

    s = Stepper(link_bps=100e9)
    write(s, 1024 * 4)
    nic = s.a.nic
    nic.receive_datagram(encode_vxlan(1, encode_pfc(s.b.nic.mac, {3: 1000})), 0.0)
    assert nic.next_datagram(0.0) is None
    pause = 1000 * 512 / 100e9
    assert nic.get_timer() == pytest.approx(pause)
    assert nic.next_datagram(pause * 0.999) is None
    assert nic.next_datagram(pause) is not None
    nic.receive_datagram(encode_vxlan(1, encode_pfc(s.b.nic.mac, {3: 0xFFFF})), pause)
    assert nic.next_datagram(pause * 2) is None
    nic.receive_datagram(encode_vxlan(1, encode_pfc(s.b.nic.mac, {3: 0})), pause * 2)  # XON
    assert nic.next_datagram(pause * 2 + 1e-6) is not None
    assert nic.pause_frames_received[3] == 3


def test_egress_paces_frames_at_line_rate() -> None:
    s = Stepper(link_bps=10e9, mtu=1024)
    write(s, 1024 * 8)
    nic = s.a.nic
    t, departures = 0.0, list[tuple[float, int]]()
    while len(departures) < 8:
        d = nic.next_datagram(t)
        if d is None:
            t = nic.get_timer()  # type: ignore[assignment]
            continue
        departures.append((t, len(d) - 8))
    for (t0, size), (t1, _) in itertools.pairwise(departures):
        assert t1 - t0 == pytest.approx((size + 24) * 8 / 10e9)


def test_read_recovers_from_lost_responses() -> None:
    def tamper(side: int, data: bytes, now: float) -> list[bytes]:
        f = decode(data)
        if side == 1 and f.opcode != Opcode.RC_ACKNOWLEDGE and f.psn in lost:
            lost.discard(f.psn)
            return []
        return [data]

    s = Stepper(mtu=1024, psn=(100, 0), timeout=8, tamper=tamper)
    lost = {psn_add(100, 3), psn_add(100, 7), psn_add(100, 9)}
    local, remote = np.zeros(10 * 1024, dtype=np.uint8), pattern(10 * 1024)
    ma, mb = s.reg(s.a, local), s.reg(s.b, remote)
    s.a.nic.post_send(
        s.a.qp,
        SendWR(
            1,
            WrOpcode.RDMA_READ,
            [Sge(ma.addr, len(local), ma.lkey)],
            remote_addr=mb.addr,
            rkey=mb.rkey,
        ),
    )
    assert run_until_completions(s)[0].status is WcStatus.SUCCESS
    assert (local == remote).all()
    assert s.a.nic.counters.implied_nak_seq_err >= 1


def test_priorities_strict_order_and_pause_per_priority() -> None:
    from rocev2_emu.wire.ethernet import encode_vxlan
    from rocev2_emu.wire.pfc import encode_pfc

    s = Stepper(link_bps=100e9, mtu=1024)
    nic_a, nic_b = s.a.nic, s.b.nic
    # a second QP pair whose packets carry DSCP 46 (priority 5 by class selector)
    qa2 = nic_a.create_qp(s.a.pd, s.a.cq, s.a.cq)  # type: ignore[arg-type]
    qb2 = nic_b.create_qp(s.b.pd, s.b.cq, s.b.cq)  # type: ignore[arg-type]
    for nic, qp, peer, ip in ((nic_a, qa2, qb2, "10.0.0.2"), (nic_b, qb2, qa2, "10.0.0.1")):
        nic.modify_qp(qp, QPAttr(qp_state=QPState.INIT, port_num=1, qp_access_flags=RW))
        nic.modify_qp(
            qp,
            QPAttr(
                qp_state=QPState.RTR,
                path_mtu=1024,
                dest_qp_num=peer.qpn,
                rq_psn=0,
                max_dest_rd_atomic=1,
                min_rnr_timer=1,
                ah_attr=ip,
                traffic_class=46,
            ),
        )
        nic.modify_qp(
            qp,
            QPAttr(
                qp_state=QPState.RTS,
                sq_psn=0,
                timeout=14,
                retry_cnt=7,
                rnr_retry=7,
                max_rd_atomic=1,
            ),
        )
    assert (s.a.qp.priority, qa2.priority) == (3, 5)
    src, dst = pattern(4096), np.zeros(8192, dtype=np.uint8)
    ma, mb = s.reg(s.a, src), s.reg(s.b, dst)
    for qp, off in ((s.a.qp, 0), (qa2, 4096)):
        nic_a.post_send(
            qp,
            SendWR(
                off,
                WrOpcode.RDMA_WRITE,
                [Sge(ma.addr, 4096, ma.lkey)],
                remote_addr=mb.addr + off,
                rkey=mb.rkey,
            ),
        )
    t, order = 0.0, list[int]()
    while len(order) < 8:  # strict priority: all of priority 5 leaves before priority 3
        d = nic_a.next_datagram(t)
        if d is None:
            t = nic_a.get_timer()  # type: ignore[assignment]
            continue
        order.append(decode(d).dscp)
    assert order == [46] * 4 + [26] * 4
    # pause priority 3 only: priority 5 still sends
    for qp, off in ((s.a.qp, 0), (qa2, 4096)):
        nic_a.post_send(
            qp,
            SendWR(
                9,
                WrOpcode.RDMA_WRITE,
                [Sge(ma.addr, 1024, ma.lkey)],
                remote_addr=mb.addr + off,
                rkey=mb.rkey,
            ),
        )
    t_pause = t + 1e-6
    nic_a.receive_datagram(encode_vxlan(1, encode_pfc(nic_b.mac, {3: 0xFFFF, 5: 0})), t_pause)
    sent, t = [], t_pause
    for _ in range(10):
        d = nic_a.next_datagram(t)
        if d is not None:
            sent.append(decode(d).dscp)
        else:
            t = max(t, nic_a.get_timer() or t)
            if t >= t_pause + 1e-4:
                break
    assert sent == [46]
    assert nic_a.get_timer() == pytest.approx(t_pause + 0xFFFF * 512 / 100e9)
