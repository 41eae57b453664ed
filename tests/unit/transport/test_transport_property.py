"""A property of the RC transport: whatever a seeded network does to the frames (loss,
duplication, reordering, corruption), every message completes successfully and arrives
byte-exact, or the QP fails with a retry error - it never hangs and never corrupts memory."""

from __future__ import annotations

import random

import numpy as np
from hypothesis import event, given, settings
from hypothesis import strategies as st

from rocev2_emu.transport.work import RecvWR, SendWR, Sge, WcStatus, WrOpcode
from tests.unit.stepper import Stepper, gather


@settings(max_examples=200, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    loss=st.floats(0, 0.15),
    dup=st.floats(0, 0.1),
    reorder=st.floats(0, 0.1),
    corrupt=st.floats(0, 0.05),
    mtu=st.sampled_from([256, 1024, 4096]),
    sizes=st.lists(st.integers(0, 20_000), min_size=1, max_size=6),
    op=st.sampled_from([WrOpcode.RDMA_WRITE, WrOpcode.RDMA_READ, WrOpcode.SEND]),
    psn=st.integers(0, 0xFFFFFF),
)
def test_messages_arrive_exactly_or_fail_cleanly(
    seed: int,
    loss: float,
    dup: float,
    reorder: float,
    corrupt: float,
    mtu: int,
    sizes: list[int],
    op: WrOpcode,
    psn: int,
) -> None:
    rng = random.Random(seed)
    held: list[bytes] = []

    def tamper(side: int, data: bytes, now: float) -> list[bytes]:
        r = rng.random()
        out = [] if r < loss else [data, data] if r < loss + dup else [data]
        if out and rng.random() < corrupt:
            b = bytearray(out[0])
            b[rng.randrange(8, len(b))] ^= 1 << rng.randrange(8)
            out[0] = bytes(b)
        if out and rng.random() < reorder:
            held.extend(out)
            return []
        if held and rng.random() < 0.5:
            out += held
            held.clear()
        return out

    s = Stepper(mtu=mtu, timeout=8, retry_cnt=7, psn=(psn, (psn * 7) & 0xFFFFFF), tamper=tamper)
    total = sum(sizes)
    src = np.random.default_rng(seed).integers(0, 256, max(1, total), dtype=np.uint8)
    dst = np.zeros(max(1, total), dtype=np.uint8)
    if op is WrOpcode.RDMA_READ:
        ma, mb = s.reg(s.a, dst), s.reg(s.b, src)
    else:
        ma, mb = s.reg(s.a, src), s.reg(s.b, dst)
    off = 0
    for i, n in enumerate(sizes):
        if op is WrOpcode.SEND:
            s.b.nic.post_recv(s.b.qp, RecvWR(i, [Sge(mb.addr + off, n, mb.lkey)]))
        s.a.nic.post_send(
            s.a.qp,
            SendWR(
                i, op, [Sge(ma.addr + off, n, ma.lkey)], remote_addr=mb.addr + off, rkey=mb.rkey
            ),
        )
        off += n
    got: list = []  # type: ignore[type-arg]
    s.run(lambda: gather(got, s.a.completions()) >= len(sizes), max_time=60.0)
    statuses = [w.status for w in got]
    event("all delivered" if all(x is WcStatus.SUCCESS for x in statuses) else "retries ran out")
    event("retransmitted" if s.a.nic.counters.retransmitted_packets else "clean")
    if all(st_ is WcStatus.SUCCESS for st_ in statuses):
        assert [w.wr_id for w in got] == list(range(len(sizes)))
        assert (src[:total] == dst[:total]).all()
    else:  # only retries running out may fail a message; the rest are flushed, in order
        k = next(i for i, x in enumerate(statuses) if x is not WcStatus.SUCCESS)
        assert statuses[k] in (WcStatus.RETRY_EXC_ERR, WcStatus.RNR_RETRY_EXC_ERR)
        assert all(x is WcStatus.WR_FLUSH_ERR for x in statuses[k + 1 :])
