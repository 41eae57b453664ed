"""The verbs API and the trio driver under trio's MockClock: an in-memory fabric with a seeded
lossy link, so hours of retransmission timers run in milliseconds and every run is the same."""

from __future__ import annotations

import tomllib

import numpy as np
import pytest
import trio
import trio.testing

from rocev2_emu.fabric.virtual import virtual_fabric
from rocev2_emu.nic.driver import EngineNic
from rocev2_emu.runtime.link import LinkFaults
from rocev2_emu.runtime.memory_ports import MemoryNetwork
from rocev2_emu.topology.file import parse
from rocev2_emu.topology.generate import leaf_spine
from rocev2_emu.transport.errors import LocalVerbsError, RemoteVerbsError
from rocev2_emu.transport.memory import Access
from rocev2_emu.transport.qp_state import QPState
from rocev2_emu.transport.work import RecvWR, SendWR, Sge, WcStatus, WorkCompletion, WrOpcode
from rocev2_emu.verbs.api import CQ, MR, PD, QP, Context, DeviceConfig, RemoteQP

RW = Access.LOCAL_WRITE | Access.REMOTE_WRITE | Access.REMOTE_READ | Access.REMOTE_ATOMIC
A, B = ("127.0.0.2", 4789), ("127.0.0.3", 4789)


def lossy(seed: int) -> LinkFaults:
    return LinkFaults(
        loss=0.01, duplicate=0.01, reorder=0.01, corrupt=0.005, delay=2e-6, jitter=1e-6, seed=seed
    )


def writer_and_target(a: Context, b: Context) -> tuple[MR, MR, CQ, QP]:
    """A 4 KiB source on ``a``, a 4 KiB target on ``b``, and ``a``'s QP (on its CQ) connected
    to one of ``b``'s."""
    pa, pb = PD(a), PD(b)
    ma = MR(pa, np.arange(4096, dtype=np.uint8), RW)
    mb = MR(pb, np.zeros(4096, dtype=np.uint8), RW)
    ca = CQ(a)
    qa, qb = QP(pa, ca), QP(pb, CQ(b))
    qa.connect(RemoteQP(qb.qp_num, qb.psn, b.gid))
    qb.connect(RemoteQP(qa.qp_num, qa.psn, a.gid))
    return ma, mb, ca, qa


async def collect(cq: CQ, n: int, timeout: float = 30.0) -> list[WorkCompletion]:
    got: list[WorkCompletion] = []
    while len(got) < n:
        got += await cq.wait(n - len(got), timeout=timeout)
    return got


@pytest.mark.parametrize("op", [WrOpcode.RDMA_WRITE, WrOpcode.RDMA_READ, WrOpcode.SEND])
async def test_data_is_exact_over_a_lossy_reordering_duplicating_link(
    autojump_clock: trio.testing.MockClock, op: WrOpcode
) -> None:
    net = MemoryNetwork()
    n, chunk = 1 << 20, 64 << 10
    cfg = dict(link_gbps=100.0, tdf=1.0)
    async with (
        Context.open(
            DeviceConfig(bind=A[0], faults=lossy(1), **cfg),  # type: ignore[arg-type]
            port=net.port(A, B),
        ) as a,
        Context.open(
            DeviceConfig(bind=B[0], faults=lossy(2), **cfg),  # type: ignore[arg-type]
            port=net.port(B, A),
        ) as b,
    ):
        src = np.random.default_rng(7).integers(0, 256, n, dtype=np.uint8)
        dst = np.zeros(n, dtype=np.uint8)
        local, remote = (dst, src) if op is WrOpcode.RDMA_READ else (src, dst)
        pa, pb = PD(a), PD(b)
        ma, mb = MR(pa, local, RW), MR(pb, remote, RW)
        ca, cb = CQ(a), CQ(b)
        qa, qb = QP(pa, ca), QP(pb, cb)
        qa.connect(RemoteQP(qb.qp_num, qb.psn, b.gid), path_mtu=1024, timeout=10)
        qb.connect(RemoteQP(qa.qp_num, qa.psn, a.gid), path_mtu=1024, timeout=10)
        if op is WrOpcode.SEND:
            qb.post_recv(
                [RecvWR(k, [Sge(mb.addr + k * chunk, chunk, mb.lkey)]) for k in range(n // chunk)]
            )
        qa.post_send(
            [
                SendWR(
                    k,
                    op,
                    [Sge(ma.addr + k * chunk, chunk, ma.lkey)],
                    remote_addr=mb.addr + k * chunk,
                    rkey=mb.rkey,
                )
                for k in range(n // chunk)
            ]
        )
        wcs = await collect(ca, n // chunk)
        assert [w.status for w in wcs] == [WcStatus.SUCCESS] * (n // chunk)
        assert [w.wr_id for w in wcs] == list(range(n // chunk))
        assert (src == dst).all()
        if op is WrOpcode.SEND:
            assert len(await collect(cb, n // chunk)) == n // chunk
        counters = a.core.counters
        assert counters.retransmitted_packets > 0  # the link really lost frames
        assert a.driver.link is not None and a.driver.link.lost > 0
        dropped = a.core.counters.rx_drops + b.core.counters.rx_drops
        assert dropped["icrc"] + dropped["ipv4_checksum"] > 0  # corruption was caught


async def test_completion_wait_has_a_deadline(autojump_clock: trio.testing.MockClock) -> None:
    net = MemoryNetwork()
    async with Context.open(DeviceConfig(tdf=1.0), port=net.port(A, B)) as ctx:
        cq = CQ(ctx)
        start = trio.current_time()
        with pytest.raises(RemoteVerbsError, match="no completion"):
            await cq.wait(timeout=0.25)
        assert trio.current_time() - start == pytest.approx(0.25)


async def test_a_cq_handler_sees_each_completion_when_it_is_made_until_removed(
    autojump_clock: trio.testing.MockClock,
) -> None:
    net = MemoryNetwork()
    async with (
        Context.open(DeviceConfig(bind=A[0], tdf=1.0), port=net.port(A, B)) as a,
        Context.open(DeviceConfig(bind=B[0], tdf=1.0), port=net.port(B, A)) as b,
    ):
        ma, mb, ca, qa = writer_and_target(a, b)
        seen: list[tuple[int, float]] = []
        done = trio.Event()

        def handler() -> bool:
            for wc in ca.poll(16):
                seen.append((wc.wr_id, a.now()))
            if len(seen) == 4:
                done.set()
            return True

        def write(k: int) -> SendWR:
            sge = [Sge(ma.addr + k * 1024, 1024, ma.lkey)]
            return SendWR(k, WrOpcode.RDMA_WRITE, sge, remote_addr=mb.addr + k * 1024, rkey=mb.rkey)

        ca.set_handler(handler)
        posted = a.now()
        qa.post_send([write(k) for k in range(4)])
        with trio.fail_after(1.0):
            await done.wait()
        assert [k for k, _ in seen] == [0, 1, 2, 3]
        times = [t for _, t in seen]
        assert times == sorted(times) and times[-1] > posted  # the ACKs came in line-rate order
        assert ca.poll(16) == []  # the handler took them all
        ca.set_handler(None)
        qa.post_send(write(0))
        (wc,) = await ca.wait(timeout=0.1)
        assert wc.status is WcStatus.SUCCESS and len(seen) == 4


async def test_dead_peer_ends_in_retry_exceeded_within_the_qp_timeout(
    autojump_clock: trio.testing.MockClock,
) -> None:
    net = MemoryNetwork()
    timeout_code, retry_cnt = 12, 3  # 16.8 ms per try, 4 tries
    async with Context.open(DeviceConfig(tdf=1.0), port=net.port(A, B)) as a:
        pa = PD(a)
        ca = CQ(a)
        qa = QP(pa, ca)
        buf = np.zeros(1 << 20, dtype=np.uint8)
        ma = MR(pa, buf, RW)
        async with Context.open(DeviceConfig(bind=B[0], tdf=1.0), port=net.port(B, A)) as b:
            pb = PD(b)
            qb = QP(pb, CQ(b))
            mb = MR(pb, np.zeros(1 << 20, dtype=np.uint8), RW)
            qa.connect(
                RemoteQP(qb.qp_num, qb.psn, b.gid), timeout=timeout_code, retry_cnt=retry_cnt
            )
            qb.connect(RemoteQP(qa.qp_num, qa.psn, a.gid))
            qa.post_send(
                [
                    SendWR(
                        k,
                        WrOpcode.RDMA_WRITE,
                        [Sge(ma.addr, 1 << 20, ma.lkey)],
                        remote_addr=mb.addr,
                        rkey=mb.rkey,
                    )
                    for k in range(4)
                ]
            )
            await a.sleep(20e-6)  # mid-transfer ...
        killed = a.now()  # ... the peer's NIC is gone
        wcs = await collect(ca, 4, timeout=1.0)
        assert [w.status for w in wcs] == [WcStatus.RETRY_EXC_ERR] + [WcStatus.WR_FLUSH_ERR] * 3
        bound = 4.096e-6 * 2**timeout_code * (retry_cnt + 1)
        assert a.now() - killed <= bound + 1e-3
        assert qa.state is QPState.ERR
        assert a.core.counters.local_ack_timeout_err == retry_cnt + 1


async def test_api_misuse_is_a_local_error(autojump_clock: trio.testing.MockClock) -> None:
    net = MemoryNetwork()
    async with Context.open(DeviceConfig(), port=net.port(A, B)) as ctx:
        pd = PD(ctx)
        qp = QP(pd, CQ(ctx))
        mr = MR(pd, bytearray(64), RW)
        with pytest.raises(LocalVerbsError, match="RESET"):
            qp.post_send(SendWR(1, WrOpcode.SEND, [Sge(mr.addr, 8, mr.lkey)]))
        with pytest.raises(LocalVerbsError, match="not a buffer"):
            MR(pd, 12345, RW)
        mr.close()
        with pytest.raises(LocalVerbsError, match="already"):
            mr.close()


@pytest.mark.parametrize(
    ("hold", "naks_per_reordered"),
    [(5e-6, 1), (0.5e-6, 2)],  # held longer than the NAK's round trip (2 us), and shorter
)
async def test_go_back_n_restarts_once_per_sequence_error_episode_under_reordering(
    autojump_clock: trio.testing.MockClock, hold: float, naks_per_reordered: int
) -> None:
    """A 4 MiB WRITE (4 096 packets at MTU 1024) over a 100 Gbit/s link that holds 1 % of its
    frames back: each held frame opens one sequence-error episode (one NAK, one restart of
    the window at the NAK'd PSN) - two when it arrives before the NAK's round trip ends (the
    late frame closes the first episode; the frames the responder dropped during it open a
    second, IBTA-conformant) - and each costs go-back-N about one bandwidth-delay product of
    resent packets (23 at a 2 us round trip), never a restart per dropped packet nor an ACK
    timeout.  docs/architecture.md, "Recovery under reordering", has the figures."""
    net = MemoryNetwork()
    n = 4 << 20
    cfg = dict(link_gbps=100.0, tdf=1.0)
    faults = LinkFaults(reorder=0.01, reorder_hold=hold, delay=1e-6, seed=1)
    async with (
        Context.open(
            DeviceConfig(bind=A[0], faults=faults, **cfg),  # type: ignore[arg-type]
            port=net.port(A, B),
        ) as a,
        Context.open(
            DeviceConfig(bind=B[0], faults=LinkFaults(delay=1e-6), **cfg),  # type: ignore[arg-type]
            port=net.port(B, A),
        ) as b,
    ):
        src = np.random.default_rng(7).integers(0, 256, n, dtype=np.uint8)
        dst = np.zeros(n, dtype=np.uint8)
        pa, pb = PD(a), PD(b)
        ma, mb = MR(pa, src, RW), MR(pb, dst, RW)
        ca = CQ(a)
        qa, qb = QP(pa, ca), QP(pb, CQ(b))
        qa.connect(RemoteQP(qb.qp_num, qb.psn, b.gid), path_mtu=1024, timeout=14)
        qb.connect(RemoteQP(qa.qp_num, qa.psn, a.gid), path_mtu=1024, timeout=14)
        sges = [Sge(ma.addr, n, ma.lkey)]
        wr = SendWR(1, WrOpcode.RDMA_WRITE, sges, remote_addr=mb.addr, rkey=mb.rkey)
        qa.post_send([wr])
        (wc,) = await collect(ca, 1)
        assert wc.status is WcStatus.SUCCESS and np.array_equal(src, dst)
        link = a.driver.link
        assert link is not None
        held, req = link.reordered, qa.qp.counters
        assert 50 <= held <= 80  # 1 % of the ~5 300 frames sent, resends included
        assert req.local_ack_timeout_err == 0
        assert held / 2 <= req.packet_seq_err <= naks_per_reordered * held
        assert req.retransmitted_packets <= 24 * held  # one BDP per held frame, at most
        assert qb.qp.counters.out_of_sequence > 10 * req.packet_seq_err  # dropped, not NAK'd


async def test_a_cq_handler_run_by_the_event_engine_reads_the_instant_of_its_completions(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """In virtual time the engine runs instant after instant without trio while no task wakes;
    a CQ handler that wakes none (a collective driven by its completions) still reads the
    emulated time of the completions it is handed, not the instant trio last ran at."""
    topo = parse(tomllib.loads(leaf_spine(1, 1, 2)), "pair.toml")
    async with virtual_fabric(topo) as (_, agents):
        a, b = agents["h0"].ctx, agents["h1"].ctx
        assert isinstance(a.driver, EngineNic)
        engine = a.driver.engine
        ma, mb, ca, qa = writer_and_target(a, b)
        seen: list[tuple[float, float]] = []  # (the handler's clock, the engine's time)

        def handler() -> bool:
            for _ in ca.poll(16):
                seen.append((a.now(), engine.now))
            return False  # woke no task: the engine runs on without trio

        ca.set_handler(handler)
        sge = [Sge(ma.addr, 1024, ma.lkey)]
        for k in range(4):
            qa.post_send(SendWR(k, WrOpcode.RDMA_WRITE, sge, remote_addr=mb.addr, rkey=mb.rkey))
        await trio.sleep(1e-3)  # emulated: every completion comes in this one stretch
        ca.set_handler(None)
    assert len(seen) == 4
    assert [clock for clock, _ in seen] == pytest.approx([t for _, t in seen], abs=1e-12)
    assert seen[0][0] > 0
