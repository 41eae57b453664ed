"""perftest's printed output: the banner a server prints once it listens, the header, the
local and remote address lines, and the transport's counters after a run (perftest's own
layout, with the emulation's time scale stated)."""

from __future__ import annotations

import subprocess

from rocev2_emu.fabric.options import Clock
from rocev2_emu.tools.perftest.options import LINE, TITLES, PerftestOptions, Side
from rocev2_emu.verbs.api import Context


def wait_until_listening(server: subprocess.Popen[str]) -> None:
    """Until the server listens (its "Waiting for client" banner); the client fails at once
    when nothing listens, as perftest's does."""
    assert server.stdout is not None
    for line in server.stdout:
        if "Waiting for client to connect" in line:
            return
    raise RuntimeError(f"the perftest server exited with code {server.wait()} before it listened")


def waiting_for_client() -> None:
    print(
        "************************************\n"
        "* Waiting for client to connect... *\n"
        "************************************",
        flush=True,
    )


def print_addresses(side: Side) -> None:
    for i, qp in enumerate(side.qps):
        print(
            f" local address: LID 0000 QPN 0x{qp.qp_num:04x} PSN 0x{qp.psn:06x} "
            f"RKey 0x{side.mr.rkey:08x} VAddr 0x{side.mr.addr + i * side.per_qp:016x}"
        )
        print(f" GID: {gid_str(side.ctx.gid)}")
        r = side.remote[i]
        print(
            f" remote address: LID 0000 QPN 0x{r.qpn:04x} PSN 0x{r.psn:06x} "
            f"RKey 0x{r.rkey:08x} VAddr 0x{r.vaddr:016x}"
        )
        print(f" GID: {gid_str(r.gid)}")


def gid_str(ip: str) -> str:
    return "00:00:00:00:00:00:00:00:00:00:255:255:" + ":".join(
        f"{int(o):02d}" for o in ip.split(".")
    )


def print_header(opts: PerftestOptions, batch_io: str = "off") -> None:
    print(LINE)
    print(f"                    {TITLES[opts.test]}")
    print(f" Number of qps   : {opts.qps}\t\tTransport type : IB")
    print(" Connection type : RC\t\tUsing SRQ      : OFF")
    print(f" TX depth        : {opts.tx_depth}")
    print(f" Mtu             : {opts.mtu}[B]")
    print(" Link type       : Ethernet (RoCEv2 over VXLAN/UDP)")
    rate = f"{opts.rate_gbps:g} Gbit/s" if opts.rate_gbps else "unpaced"
    if opts.clock is Clock.WALL:
        print(f" Emulation       : TDF {opts.tdf:g}, link {rate}; figures in emulated time")
        print(f" Batched I/O     : {batch_io} (UDP GSO/GRO; --no-batch-io: one datagram a call)")
        print(" Data ex. method : Ethernet (msgpack over TCP)")
    else:
        print(
            f" Emulation       : clock {opts.clock}, link {rate}, {opts.delay_us:g} us; figures "
            "in emulated time"
        )
        print(" Data ex. method : the fabric's rendezvous store (emulated, 2 us away)")
    print(LINE)


def print_transport(ctx: Context) -> None:
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
