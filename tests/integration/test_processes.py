"""Real processes, real UDP on 127.0.0.0/8: data byte-exact under loss, reordering and
duplication, and a peer killed mid-transfer ends in retry-exceeded, never a hang."""

from __future__ import annotations

import hashlib
import os
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path

import numpy as np
import pytest

from rocev2_emu.runtime.link import LinkFaults
from rocev2_emu.transport.memory import Access
from rocev2_emu.transport.work import SendWR, Sge, WcStatus, WorkCompletion, WrOpcode
from rocev2_emu.verbs.api import CQ, MR, PD, QP, Context, DeviceConfig
from rocev2_emu.verbs.oob import OobChannel, QPInfo
from tests.integration.peer import RECV_CHUNK, seeded

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
SIZE = 4 << 20
FAULTS = dict(loss=0.01, duplicate=0.01, reorder=0.01)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def peer_process(nic_addr: str, oob_port: int, *extra: str) -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.integration.peer",
            "--nic-addr",
            nic_addr,
            "--oob-port",
            str(oob_port),
            "--size",
            str(SIZE),
            *extra,
        ],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)


@asynccontextmanager
async def connected(
    nic_addr: str, oob_port: int, faults: LinkFaults, qp_timeout: int = 14, retry_cnt: int = 7
) -> AsyncIterator[tuple[Context, QP, CQ, MR, np.ndarray, QPInfo, OobChannel]]:
    async with Context.open(
        DeviceConfig(bind=nic_addr, link_gbps=0, tdf=1.0, faults=faults)
    ) as ctx:
        buf = np.zeros(SIZE, dtype=np.uint8)
        pd = PD(ctx)
        mr = MR(pd, buf, Access.LOCAL_WRITE)
        cq = CQ(ctx, 1 << 16)
        qp = QP(pd, cq, max_send_wr=4096)
        chan = await OobChannel.connect("127.0.0.1", oob_port, timeout=60)
        host, port = ctx.udp_address
        (remote,), _ = await chan.exchange([QPInfo(qp.qp_num, qp.psn, ctx.gid, host, port)])
        qp.connect(remote.remote(), path_mtu=1024, timeout=qp_timeout, retry_cnt=retry_cnt)
        assert await chan.recv() == {"ready": True}
        try:
            yield ctx, qp, cq, mr, buf, remote, chan
        finally:
            await chan.aclose()


async def completions(cq: CQ, n: int, timeout: float) -> list[WorkCompletion]:
    got: list[WorkCompletion] = []
    while len(got) < n:
        got += await cq.wait(n - len(got), timeout=timeout)
    return got


@pytest.mark.parametrize("op", ["write", "read", "send"])
async def test_a_few_mib_byte_exact_under_loss_reordering_and_duplication(op: str) -> None:
    port = free_port()
    addr = {"write": "127.0.0.21", "read": "127.0.0.23", "send": "127.0.0.25"}[op]
    peer_addr = addr[:-2] + str(int(addr[-2:]) + 1)
    flags = [f"--{k}={v}" for k, v in FAULTS.items()]
    with peer_process(peer_addr, port, *flags) as proc:
        async with connected(addr, port, LinkFaults(seed=3, **FAULTS)) as (
            ctx,
            qp,
            cq,
            mr,
            buf,
            remote,
            chan,
        ):
            chunk = RECV_CHUNK
            if op != "read":
                buf[:] = seeded(SIZE, 99)
            wr_op = {
                "write": WrOpcode.RDMA_WRITE,
                "read": WrOpcode.RDMA_READ,
                "send": WrOpcode.SEND,
            }[op]
            n = SIZE // chunk
            qp.post_send(
                [
                    SendWR(
                        k,
                        wr_op,
                        [Sge(mr.addr + k * chunk, chunk, mr.lkey)],
                        remote_addr=remote.vaddr + k * chunk,
                        rkey=remote.rkey,
                    )
                    for k in range(n)
                ]
            )
            wcs = await completions(cq, n, timeout=120)
            assert [w.status for w in wcs] == [WcStatus.SUCCESS] * n
            await chan.send({"cmd": "digest"})
            reply = await chan.recv()
            if op == "read":
                assert (buf == seeded(SIZE, 5)).all()
            else:
                assert reply["sha256"] == hashlib.sha256(buf.tobytes()).hexdigest()
            if op == "send":
                assert reply["received"] == n
            assert ctx.core.counters.retransmitted_packets > 0  # faults really happened
            await chan.send({"cmd": "exit"})
            assert await chan.recv() == {"bye": True}
        assert proc.wait(30) == 0


async def test_peer_killed_mid_transfer_completes_with_retry_exceeded() -> None:
    port = free_port()
    timeout_code, retry_cnt = 12, 3  # 16.8 ms per try
    with peer_process("127.0.0.32", port) as proc:
        async with connected(
            "127.0.0.31", port, LinkFaults(), qp_timeout=timeout_code, retry_cnt=retry_cnt
        ) as (ctx, qp, cq, mr, _buf, remote, _chan):
            n = 256
            qp.post_send(
                [
                    SendWR(
                        k,
                        WrOpcode.RDMA_WRITE,
                        [Sge(mr.addr, SIZE, mr.lkey)],
                        remote_addr=remote.vaddr,
                        rkey=remote.rkey,
                    )
                    for k in range(n)
                ]
            )
            first = await completions(cq, 1, timeout=60)  # data is flowing ...
            assert first[0].status is WcStatus.SUCCESS
            proc.send_signal(signal.SIGKILL)  # ... when the server dies
            proc.wait(10)
            bound = 4.096e-6 * 2**timeout_code * (retry_cnt + 1)
            # every outstanding request completes, the first with RETRY_EXC_ERR, within the
            # transport's own deadline (plus slack for this busy machine), never a hang
            rest = await completions(cq, n - 1, timeout=bound * 5 + 2.0)
            statuses = [w.status for w in rest]
            k = statuses.index(WcStatus.RETRY_EXC_ERR)
            assert all(s is WcStatus.SUCCESS for s in statuses[:k])
            assert all(s is WcStatus.WR_FLUSH_ERR for s in statuses[k + 1 :])
            assert ctx.core.counters.local_ack_timeout_err == retry_cnt + 1
