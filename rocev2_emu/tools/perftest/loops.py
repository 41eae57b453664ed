"""perftest's measurement loops: bandwidth (keep tx-depth messages in flight per QP; the send
test's server keeps every receive queue full) and latency (ping-pong RDMA WRITEs, each side
polling its memory for the peer's iteration number), with perftest's peak and percentiles."""

from __future__ import annotations

import itertools
import statistics

import numpy as np
import trio

from rocev2_emu.stats import percentile
from rocev2_emu.tools.perftest.options import (
    LINE,
    PerftestError,
    PerftestOptions,
    Side,
    check,
    sizes,
)
from rocev2_emu.transport.errors import RemoteVerbsError
from rocev2_emu.transport.work import (
    RecvWR,
    SendFlags,
    SendWR,
    Sge,
    WrOpcode,
)
from rocev2_emu.verbs.oob import PeerExchange


async def bandwidth(side: Side, chan: PeerExchange, opts: PerftestOptions) -> None:
    unit = "Gb/sec" if opts.report_gbits else "MB/sec"
    print(f" #bytes     #iterations    BW peak[{unit}]    BW average[{unit}]   MsgRate[Mpps]")
    for size in sizes(opts):
        if opts.test == "send_bw" and opts.is_server:
            count, elapsed, peak = await _receive_sends(side, opts, size)
        else:
            count, elapsed, peak = await _post_loop(side, opts, size)
        await chan.barrier(f"size-{size}")
        avg = size * count / elapsed if elapsed > 0 else 0.0
        scale = 8 / 1e9 if opts.report_gbits else 1 / 2**20
        print(
            f" {size:<10d} {count:<10d}       {peak * scale:<10.2f}         {avg * scale:<10.2f}"
            f"\t\t   {count / elapsed / 1e6 if elapsed > 0 else 0.0:.6f}"
        )
    await chan.barrier("done")
    print(LINE)


async def _post_loop(side: Side, opts: PerftestOptions, size: int) -> tuple[int, float, float]:
    """Client side of write/read/send bandwidth: keep tx_depth messages in flight per QP."""
    op = {"write_bw": WrOpcode.RDMA_WRITE, "read_bw": WrOpcode.RDMA_READ, "send_bw": WrOpcode.SEND}[
        opts.test
    ]
    ctx = side.ctx
    depth = min(opts.tx_depth, 16) if op is WrOpcode.RDMA_READ else opts.tx_depth
    cq_mod = 1 if opts.duration else max(1, min(100, depth // 2))
    outstanding = [0] * len(side.qps)
    posted = [0] * len(side.qps)
    completed = 0
    iters = opts.iters if not opts.duration else 1 << 62
    start = ctx.now()
    stop_at = start + opts.duration if opts.duration else None
    stamps: list[tuple[float, int]] = [(start, 0)]
    while True:
        for i, qp in enumerate(side.qps):
            info = side.remote[i]
            batch = []
            while (
                outstanding[i] < depth
                and posted[i] < iters
                and (stop_at is None or ctx.now() < stop_at)
            ):
                posted[i] += 1
                flags = (
                    SendFlags.SIGNALED
                    if posted[i] % cq_mod == 0 or posted[i] == iters
                    else SendFlags.NONE
                )
                laddr = side.mr.addr + i * side.per_qp
                batch.append(
                    SendWR(
                        posted[i],
                        op,
                        [Sge(laddr, size, side.mr.lkey)],
                        flags,
                        remote_addr=info.vaddr,
                        rkey=info.rkey,
                    )
                )
                outstanding[i] += 1
            if batch:
                qp.post_send(batch)
        if all(outstanding[i] == 0 for i in range(len(side.qps))):
            break
        wcs = await side.cq.wait(64, timeout=side.cq_timeout)
        check(wcs)
        for wc in wcs:
            i = next(k for k, qp in enumerate(side.qps) if qp.qp_num == wc.qp_num)
            n = cq_mod if wc.wr_id % cq_mod == 0 else wc.wr_id % cq_mod
            outstanding[i] -= n
            completed += n
        stamps.append((ctx.now(), completed))
        if stop_at is not None and ctx.now() >= stop_at:
            iters = 0  # post nothing more; drain what is in flight
    elapsed = stamps[-1][0] - start
    return completed, elapsed, _peak(stamps, size, min(depth, max(1, completed // 4)))


def _peak(stamps: list[tuple[float, int]], size: int, window: int) -> float:
    """Best rate over any stretch of at least ``window`` messages (or the whole run)."""
    best = 0.0
    j = 0
    t_first, n_first = stamps[0]
    for t, n in stamps:
        while j + 1 < len(stamps) and n - stamps[j + 1][1] >= window:
            j += 1
        t0, n0 = stamps[j]
        if n - n0 < window:
            t0, n0 = t_first, n_first
        if t > t0 and n > n0 and n - n0 >= min(window, stamps[-1][1] - n_first):
            best = max(best, (n - n0) * size / (t - t0))
    return best


async def _receive_sends(side: Side, opts: PerftestOptions, size: int) -> tuple[int, float, float]:
    """Server side of send_bw: keep every receive queue full, count arrivals.

    Receives are posted once, as large as the largest message of the run, and each is posted
    again as it completes: with ``-a`` the sizes change, and a receive sized for the previous
    message would be too short for the next (IBTA: a local length error at the responder)."""
    depth = 512
    if not side.receives_posted:
        for i, qp in enumerate(side.qps):
            sge = Sge(side.mr.addr + i * side.per_qp, side.per_qp, side.mr.lkey)
            qp.post_recv([RecvWR(k, [sge]) for k in range(depth)])
        side.receives_posted = True
    ctx = side.ctx
    iters = opts.iters * len(side.qps)
    got = 0
    start: float | None = None
    first_batch = 0
    stamps: list[tuple[float, int]] = []
    while opts.duration or got < iters:
        try:
            wcs = await side.cq.wait(256, timeout=side.cq_timeout if got else 60.0)
        except RemoteVerbsError:
            if opts.duration and got:
                break
            raise
        check(wcs)
        now = ctx.now()
        got += len(wcs)
        if start is None:  # the first batch's arrival times are unknown: measure from it
            start = now
            first_batch = got
        stamps.append((now, got - first_batch))
        for wc in wcs:
            qp = next(q for q in side.qps if q.qp_num == wc.qp_num)
            i = side.qps.index(qp)
            qp.post_recv(
                RecvWR(wc.wr_id, [Sge(side.mr.addr + i * side.per_qp, side.per_qp, side.mr.lkey)])
            )
        if opts.duration and start is not None and now - start >= opts.duration:
            break
    assert start is not None
    elapsed = stamps[-1][0] - start
    # rate of the messages after the first batch, reported for all of them
    scaled = elapsed * got / max(1, got - first_batch)
    return got, scaled, _peak(stamps, size, min(depth, max(1, got // 4)))


async def latency(side: Side, chan: PeerExchange, opts: PerftestOptions) -> None:
    """Ping-pong RDMA WRITEs; each side polls its memory for the peer's iteration number."""
    print(
        " #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]"
        "    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec] "
    )
    ctx = side.ctx
    qp, info = side.qps[0], side.remote[0]
    for size in sizes(opts):
        send_off, recv_off = 0, side.max_size
        inbox = side.buf[recv_off : recv_off + size]
        inbox[:] = 0
        await chan.barrier(f"lat-{size}")
        stamps = []
        iters = opts.iters
        for it in range(1, iters + 1):
            tag = it & 0xFF or 1
            if opts.is_server:
                await _wait_byte(side, inbox, size - 1, tag)
            side.buf[send_off + size - 1] = tag
            qp.post_send(
                SendWR(
                    it,
                    WrOpcode.RDMA_WRITE,
                    [Sge(side.mr.addr + send_off, size, side.mr.lkey)],
                    SendFlags.SIGNALED if it % 64 == 0 or it == iters else SendFlags.NONE,
                    remote_addr=info.vaddr + side.max_size,
                    rkey=info.rkey,
                )
            )
            if not opts.is_server:
                await _wait_byte(side, inbox, size - 1, tag)
            stamps.append(ctx.now())
            check(side.cq.poll(64))
        rtts = [(b - a) / 2 * 1e6 for a, b in itertools.pairwise(stamps)]
        if not rtts:
            rtts = [0.0]
        rtts.sort()
        p99, p999 = percentile(rtts, 0.99), percentile(rtts, 0.999)
        stdev = statistics.pstdev(rtts)
        print(
            f" {size:<7d}{iters:<10d}     {rtts[0]:<10.2f}     {rtts[-1]:<10.2f}   "
            f"{statistics.median(rtts):<10.2f}     \t{statistics.fmean(rtts):<10.2f}    "
            f"\t{stdev:<10.2f}\t\t{p99:<10.2f}\t\t{p999:<10.2f}"
        )
    await chan.barrier("done")
    print(LINE)


async def _wait_byte(side: Side, inbox: np.ndarray, index: int, tag: int) -> None:
    """Poll registered memory (as perftest spins on it), waking on each received batch."""
    driver = side.ctx.driver
    with trio.move_on_after(side.ctx.clock.wall_duration(side.cq_timeout)):
        while inbox[index] != tag:
            check(side.cq.poll(64))
            await driver.next_received()
        return
    raise PerftestError(
        f"peer did not write iteration tag {tag} within {side.cq_timeout * 1e3:.0f} ms (emulated)"
    )
