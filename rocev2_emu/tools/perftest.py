"""perftest for the emulated NIC: write-bw, write-lat, send-bw and read-bw, server and client.

Behaves like linux-rdma/perftest's ib_write_bw, ib_write_lat, ib_send_bw and ib_read_bw: the
server is started without a host, the client with the server's address; the two exchange QPN,
PSN, GID, rkey and address over TCP (msgpack, :mod:`rocev2_emu.verbs.oob`), print perftest's
local/remote address lines, run the test and print perftest's table.  All figures are in
emulated time (the header states the TDF), so they describe the configured datacenter link, not
the Python process.  MB/sec means 2^20 bytes per second, as in perftest; --report_gbits gives
Gbit/s (10^9).
"""

from __future__ import annotations

import itertools
import statistics
import subprocess
from dataclasses import dataclass, field
from typing import Final, cast

import numpy as np
import trio

from rocev2_emu.nic.metrics import nic_registry
from rocev2_emu.runtime.link import LinkFaults
from rocev2_emu.runtime.metrics import serve
from rocev2_emu.stats import percentile
from rocev2_emu.transport.errors import RemoteVerbsError
from rocev2_emu.transport.memory import Access
from rocev2_emu.transport.timers import local_ack_timeout
from rocev2_emu.transport.work import (
    RecvWR,
    SendFlags,
    SendWR,
    Sge,
    WcStatus,
    WorkCompletion,
    WrOpcode,
)
from rocev2_emu.verbs.api import CQ, MR, PD, QP, Context, DeviceConfig
from rocev2_emu.verbs.oob import DEFAULT_OOB_PORT, OobChannel, QPInfo
from rocev2_emu.wire.ethernet import LINK_UDP_PORT

LINE: Final = "-" * 87
TITLES: Final = {
    "write_bw": "RDMA_Write BW Test",
    "write_lat": "RDMA_Write Latency Test",
    "send_bw": "Send BW Test",
    "read_bw": "RDMA_Read BW Test",
}
ALL_SIZES: Final = [1 << k for k in range(1, 24)]  # perftest -a: 2 B .. 8 MiB


@dataclass(slots=True)
class PerftestOptions:
    test: str
    server: str | None = None  # None: this is the server
    oob_port: int = DEFAULT_OOB_PORT
    oob_addr: str = "127.0.0.1"
    size: int = 65536
    iters: int = 5000
    duration: float = 0.0  # emulated seconds; 0: run ``iters`` iterations
    all_sizes: bool = False
    qps: int = 1
    mtu: int = 4096
    report_gbits: bool = False
    tx_depth: int = 128
    nic_addr: str = "127.0.0.2"
    nic_port: int = LINK_UDP_PORT
    rate_gbps: float = 100.0
    tdf: float = 100.0
    faults: LinkFaults = field(default_factory=LinkFaults)
    pcap: str | None = None
    metrics_port: int = 0
    qp_timeout: int = 14
    retry_cnt: int = 7
    connect_timeout: float = 60.0  # wall seconds to find the peer

    @property
    def is_server(self) -> bool:
        return self.server is None


class PerftestError(Exception):
    """A test could not run or a work request failed; the message says which and why."""


@dataclass(slots=True)
class _Side:
    ctx: Context
    pd: PD
    cq: CQ
    mr: MR
    buf: np.ndarray
    qps: list[QP]
    remote: list[QPInfo]
    max_size: int
    cq_timeout: float
    per_qp: int
    receives_posted: bool = False  # send_bw's server: its receive queues are full


def wait_until_listening(server: subprocess.Popen[str]) -> None:
    """Until the server listens (its "Waiting for client" banner); the client fails at once
    when nothing listens, as perftest's does."""
    assert server.stdout is not None
    for line in server.stdout:
        if "Waiting for client to connect" in line:
            return
    raise RuntimeError(f"the perftest server exited with code {server.wait()} before it listened")


# what a client may ask of a server: (type, lowest, highest); the server allocates size x qps
CLIENT_PARAMS: Final[dict[str, tuple[type | tuple[type, ...], float, float]]] = {
    "size": (int, 1, 1 << 31),
    "iters": (int, 1, 1 << 40),
    "duration": ((int, float), 0, 24 * 3600),
    "all_sizes": (bool, False, True),
    "qps": (int, 1, 1024),
    "mtu": (int, 256, 4096),
    "tx_depth": (int, 1, 1 << 16),
}
MAX_BUFFER: Final = 1 << 32  # bytes a server registers for a client, at most


def _waiting_for_client() -> None:
    print(
        "************************************\n"
        "* Waiting for client to connect... *\n"
        "************************************",
        flush=True,
    )


def _mismatch(params: object, opts: PerftestOptions) -> str | None:
    """Why the client's parameters cannot run against this server, or None."""
    if not isinstance(params, dict) or params.get("test") != opts.test:
        return f"client runs {params!r:.200}, this server runs {opts.test}"
    for key, (kind, low, high) in CLIENT_PARAMS.items():
        value = params.get(key)
        typed = isinstance(value, kind) and (kind is bool or not isinstance(value, bool))
        if not typed or not low <= cast(float, value) <= high:
            return f"the client's {key} = {value!r:.80} is not one of {low}..{high}"
    if params["mtu"] not in (256, 512, 1024, 2048, 4096):
        return f"the client's mtu = {params['mtu']} is not a path MTU"
    if params["size"] * params["qps"] > MAX_BUFFER:
        return f"the client asks for {params['size'] * params['qps']} bytes, over {MAX_BUFFER}"
    for key, what in (("tdf", "TDF"), ("rate_gbps", "link rate (Gbit/s)")):
        theirs, ours = params.get(key), getattr(opts, key)
        if theirs != ours:
            return (
                f"the client's {what} is {theirs}, this server's {ours}: start both sides "
                "with the same --tdf and --rate (emulated time would not agree)"
            )
    return None


def _sizes(opts: PerftestOptions) -> list[int]:
    return ALL_SIZES if opts.all_sizes else [opts.size]


async def run(opts: PerftestOptions) -> int:
    """Run one perftest side; returns the process exit code."""
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
                listening=_waiting_for_client,
            )
            params = await chan.recv()
            problem = _mismatch(params, opts)
            if problem:
                await chan.send({"error": problem})
                raise PerftestError(problem)
            for key in ("size", "iters", "duration", "all_sizes", "qps", "mtu", "tx_depth"):
                setattr(opts, key, params[key])
        else:
            assert opts.server is not None
            chan = await OobChannel.connect(
                opts.server, opts.oob_port, timeout=opts.connect_timeout, wait_for_listener=False
            )
            await chan.send(
                {
                    "test": opts.test,
                    "tdf": opts.tdf,
                    "rate_gbps": opts.rate_gbps,
                    **{
                        k: getattr(opts, k)
                        for k in (
                            "size",
                            "iters",
                            "duration",
                            "all_sizes",
                            "qps",
                            "mtu",
                            "tx_depth",
                        )
                    },
                }
            )
        side = await _setup(ctx, chan, opts)
        _print_header(opts)
        _print_addresses(side)
        print(LINE)
        await chan.barrier("connected")
        try:
            if opts.test == "write_lat":
                await _latency(side, chan, opts)
            elif opts.is_server and opts.test != "send_bw":
                for size in _sizes(opts):  # the client measures; we serve memory
                    await chan.barrier(f"size-{size}")
                await chan.barrier("done")
                print(" (results are printed by the client)")
                print(LINE)
            else:
                await _bandwidth(side, chan, opts)
            _print_transport(ctx)
        finally:
            await chan.aclose()
    return 0


async def _setup(ctx: Context, chan: OobChannel, opts: PerftestOptions) -> _Side:
    max_size = max(_sizes(opts))
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
    return _Side(ctx, pd, cq, mr, buf, qps, remote, max_size, cq_timeout, per_qp)


def _print_addresses(side: _Side) -> None:
    for i, qp in enumerate(side.qps):
        print(
            f" local address: LID 0000 QPN 0x{qp.qp_num:04x} PSN 0x{qp.psn:06x} "
            f"RKey 0x{side.mr.rkey:08x} VAddr 0x{side.mr.addr + i * side.per_qp:016x}"
        )
        print(f" GID: {_gid_str(side.ctx.gid)}")
        r = side.remote[i]
        print(
            f" remote address: LID 0000 QPN 0x{r.qpn:04x} PSN 0x{r.psn:06x} "
            f"RKey 0x{r.rkey:08x} VAddr 0x{r.vaddr:016x}"
        )
        print(f" GID: {_gid_str(r.gid)}")


def _gid_str(ip: str) -> str:
    return "00:00:00:00:00:00:00:00:00:00:255:255:" + ":".join(
        f"{int(o):02d}" for o in ip.split(".")
    )


def _print_header(opts: PerftestOptions) -> None:
    print(LINE)
    print(f"                    {TITLES[opts.test]}")
    print(f" Number of qps   : {opts.qps}\t\tTransport type : IB")
    print(" Connection type : RC\t\tUsing SRQ      : OFF")
    print(f" TX depth        : {opts.tx_depth}")
    print(f" Mtu             : {opts.mtu}[B]")
    print(" Link type       : Ethernet (RoCEv2 over VXLAN/UDP)")
    rate = f"{opts.rate_gbps:g} Gbit/s" if opts.rate_gbps else "unpaced"
    print(f" Emulation       : TDF {opts.tdf:g}, link {rate}; figures in emulated time")
    print(" Data ex. method : Ethernet (msgpack over TCP)")
    print(LINE)


def _print_transport(ctx: Context) -> None:
    """What perftest cannot show: what the transport had to do to get the figures above."""
    c = ctx.core.counters
    drops = sum(c.rx_drops.values())
    print(
        f" Transport: {c.tx_packets} frames out, {c.rx_packets} in; retransmitted "
        f"{c.retransmitted_packets}, NAK seq-err {c.packet_seq_err}, implied NAK "
        f"{c.implied_nak_seq_err}, ACK timeouts {c.local_ack_timeout_err}, RNR NAKs "
        f"{c.rnr_nak_received}, out-of-sequence {c.out_of_sequence}, duplicates "
        f"{c.duplicate_request}, dropped {drops}, socket drops {ctx.port.kernel_drops()}; "
        f"pump late {ctx.driver.late_wakeups}x"
    )


def _check(wcs: list[WorkCompletion]) -> None:
    for wc in wcs:
        if wc.status is not WcStatus.SUCCESS:
            raise PerftestError(
                f"completion with error: wr_id {wc.wr_id} status "
                f"{wc.status.name} ({int(wc.status)}) on QP 0x{wc.qp_num:06x}"
            )


async def _bandwidth(side: _Side, chan: OobChannel, opts: PerftestOptions) -> None:
    unit = "Gb/sec" if opts.report_gbits else "MB/sec"
    print(f" #bytes     #iterations    BW peak[{unit}]    BW average[{unit}]   MsgRate[Mpps]")
    for size in _sizes(opts):
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


async def _post_loop(side: _Side, opts: PerftestOptions, size: int) -> tuple[int, float, float]:
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
        _check(wcs)
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


async def _receive_sends(side: _Side, opts: PerftestOptions, size: int) -> tuple[int, float, float]:
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
        _check(wcs)
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


async def _latency(side: _Side, chan: OobChannel, opts: PerftestOptions) -> None:
    """Ping-pong RDMA WRITEs; each side polls its memory for the peer's iteration number."""
    print(
        " #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]"
        "    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec] "
    )
    ctx = side.ctx
    qp, info = side.qps[0], side.remote[0]
    for size in _sizes(opts):
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
            _check(side.cq.poll(64))
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


async def _wait_byte(side: _Side, inbox: np.ndarray, index: int, tag: int) -> None:
    """Poll registered memory (as perftest spins on it), waking on each received batch."""
    lot = side.ctx.driver.rx_lot
    with trio.move_on_after(side.ctx.clock.wall_duration(side.cq_timeout)):
        while inbox[index] != tag:
            _check(side.cq.poll(64))
            await lot.park()
        return
    raise PerftestError(
        f"peer did not write iteration tag {tag} within {side.cq_timeout * 1e3:.0f} ms (emulated)"
    )
