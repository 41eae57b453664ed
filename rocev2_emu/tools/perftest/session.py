"""One perftest side: open the NIC, exchange parameters and QPs with the peer, run the test."""

from __future__ import annotations

import numpy as np

from rocev2_emu.fabric.options import Clock
from rocev2_emu.nic.metrics import nic_registry
from rocev2_emu.runtime.metrics import serve
from rocev2_emu.runtime.ports import batch_mode
from rocev2_emu.tools.perftest.loops import bandwidth, latency
from rocev2_emu.tools.perftest.options import (
    LINE,
    TITLES,
    PerftestError,
    PerftestOptions,
    Side,
    mismatch,
    sizes,
)
from rocev2_emu.tools.perftest.report import (
    print_addresses,
    print_header,
    print_transport,
    waiting_for_client,
)
from rocev2_emu.transport.memory import Access
from rocev2_emu.transport.qp_state import local_ack_timeout
from rocev2_emu.verbs.api import CQ, MR, PD, QP, Context, DeviceConfig
from rocev2_emu.verbs.oob import OobChannel, PeerExchange, QPInfo


async def run(opts: PerftestOptions) -> int:
    """Run one perftest side on the wall clock; returns the process exit code."""
    if opts.test not in TITLES:
        raise PerftestError(f"unknown test {opts.test!r}; choose from {sorted(TITLES)}")
    config = DeviceConfig(
        bind=opts.nic_addr,
        port=opts.nic_port,
        link_gbps=opts.rate_gbps,
        tdf=opts.tdf,
        faults=opts.faults,
        pcap=opts.pcap,
    )
    async with Context.open(config) as ctx:
        if opts.metrics_port:
            serve(nic_registry(ctx.driver, opts.nic_addr), opts.metrics_port)
        if opts.is_server:
            chan = await OobChannel.accept(
                opts.oob_addr,
                opts.oob_port,
                timeout=opts.connect_timeout,
                listening=waiting_for_client,
            )
        else:
            assert opts.server is not None
            chan = await OobChannel.connect(
                opts.server, opts.oob_port, timeout=opts.connect_timeout, wait_for_listener=False
            )
        try:
            await converse(ctx, chan, opts, batch_mode(ctx.port))
        finally:
            await chan.aclose()
    return 0


PARAMS = ("size", "iters", "duration", "all_sizes", "qps", "mtu", "tx_depth")  # the client's


async def converse(ctx: Context, chan: PeerExchange, opts: PerftestOptions, batch_io: str) -> None:
    """One side's whole test over a connected out-of-band channel: the client's parameters
    to the server (checked there), the QPs swapped, the test, the transport's counters."""
    if opts.is_server:
        params = await chan.recv()
        problem = mismatch(params, opts)
        if problem:
            await chan.send({"error": problem})
            raise PerftestError(problem)
        for key in PARAMS:
            setattr(opts, key, params[key])
    else:
        await chan.send(
            {
                "test": opts.test,
                "tdf": opts.tdf,
                "rate_gbps": opts.rate_gbps,
                **{k: getattr(opts, k) for k in PARAMS},
                **({"link": opts.link_settings()} if opts.clock is not Clock.WALL else {}),
            }
        )
    side = await _setup(ctx, chan, opts)
    print_header(opts, batch_io)
    print_addresses(side)
    print(LINE)
    await chan.barrier("connected")
    if opts.test == "write_lat":
        await latency(side, chan, opts)
    elif opts.is_server and opts.test != "send_bw":
        for size in sizes(opts):  # the client measures; we serve memory
            await chan.barrier(f"size-{size}")
        await chan.barrier("done")
        print(" (results are printed by the client)")
        print(LINE)
    else:
        await bandwidth(side, chan, opts)
    print_transport(ctx)


async def _setup(ctx: Context, chan: PeerExchange, opts: PerftestOptions) -> Side:
    max_size = max(sizes(opts))
    per_qp = max_size * (2 if opts.test == "write_lat" else 1)
    buf = np.zeros(per_qp * opts.qps, dtype=np.uint8)
    buf[:] = np.arange(len(buf), dtype=np.uint64).astype(np.uint8)
    pd = PD(ctx)
    mr = MR(pd, buf, Access.LOCAL_WRITE | Access.REMOTE_WRITE | Access.REMOTE_READ)
    cq = CQ(ctx, 1 << 16)
    depth = max(opts.tx_depth, 512)
    qps = [QP(pd, cq, max_send_wr=depth, max_recv_wr=depth) for _ in range(opts.qps)]
    host, port = ctx.udp_address
    local = [
        QPInfo(qp.qp_num, qp.psn, ctx.gid, host, port, mr.rkey, mr.addr + i * per_qp, per_qp)
        for i, qp in enumerate(qps)
    ]
    remote, _ = await chan.exchange(local)
    if len(remote) != len(qps):
        raise PerftestError(f"peer has {len(remote)} QPs, we have {len(qps)}")
    for qp, info in zip(qps, remote, strict=True):
        qp.connect(
            info.remote(), path_mtu=opts.mtu, timeout=opts.qp_timeout, retry_cnt=opts.retry_cnt
        )
    ack = local_ack_timeout(opts.qp_timeout) or 1.0
    cq_timeout = ack * (opts.retry_cnt + 2) * 2 + 0.5
    return Side(ctx, pd, cq, mr, buf, qps, remote, max_size, cq_timeout, per_qp)
