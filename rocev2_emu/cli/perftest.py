"""perftest's commands: ``rocev2-emu write-bw | write-lat | send-bw | read-bw``, with perftest's
main flags and output (:mod:`rocev2_emu.tools.perftest`), plus the emulator's own (link rate,
TDF, faults, pcap, metrics).  Without SERVER a command is the server; with it, the client.
"""

from __future__ import annotations

import argparse
import sys
from functools import partial

import trio

from rocev2_emu.cli.args import (
    add_run_options,
    nonnegative_float,
    nonnegative_int,
    port_number,
    positive_float,
    positive_int,
    probability,
    run_options,
)
from rocev2_emu.cli.commands import Command, register
from rocev2_emu.fabric.options import Clock
from rocev2_emu.runtime.link import LinkFaults
from rocev2_emu.tools.perftest import PerftestOptions
from rocev2_emu.tools.perftest import run as run_perftest
from rocev2_emu.tools.perftest.pair import run_pair
from rocev2_emu.verbs.oob import DEFAULT_OOB_PORT
from rocev2_emu.wire.ethernet import LINK_UDP_PORT

PERFTESTS = {
    "write-bw": "write_bw",
    "write-lat": "write_lat",
    "send-bw": "send_bw",
    "read-bw": "read_bw",
}


def _configure(p: argparse.ArgumentParser, name: str) -> None:
    lat = name == "write-lat"
    p.add_argument("server", nargs="?", help="server address for the out-of-band exchange")
    p.add_argument(
        "-p",
        "--port",
        type=port_number,
        default=DEFAULT_OOB_PORT,
        help="out-of-band TCP port (default %(default)s)",
    )
    p.add_argument(
        "-s",
        "--size",
        type=positive_int,
        default=2 if lat else 65536,
        help="message size in bytes (default %(default)s)",
    )
    p.add_argument(
        "-n",
        "--iters",
        type=positive_int,
        default=1000 if lat else 5000,
        help="iterations (default %(default)s)",
    )
    p.add_argument(
        "-D",
        "--duration",
        type=nonnegative_float,
        default=0.0,
        help="run for this many emulated seconds instead of -n iterations",
    )
    p.add_argument("-a", "--all", action="store_true", help="all sizes from 2 B to 8 MiB")
    p.add_argument("-q", "--qp", type=positive_int, default=1, help="number of QPs (default 1)")
    p.add_argument(
        "-m",
        "--mtu",
        type=int,
        default=4096,
        choices=[256, 512, 1024, 2048, 4096],
        help="path MTU (default 4096)",
    )
    p.add_argument(
        "-t",
        "--tx-depth",
        type=positive_int,
        default=1 if lat else 128,
        help="work requests in flight per QP (default %(default)s)",
    )
    p.add_argument(
        "-u",
        "--qp-timeout",
        type=int,
        default=14,
        help="QP local ACK timeout code: 4.096 us * 2^N (default 14)",
    )
    p.add_argument(
        "--retry-cnt", type=nonnegative_int, default=7, help="transport retries (default 7)"
    )
    p.add_argument(
        "--report_gbits",
        "--report-gbits",
        action="store_true",
        dest="report_gbits",
        help="report Gbit/s instead of MB/s",
    )
    p.add_argument(
        "--oob-addr",
        default="127.0.0.1",
        help="address the server listens on for the exchange (default %(default)s)",
    )
    p.add_argument(
        "--nic-addr",
        help="UDP address of this NIC (default 127.0.0.2 for the server, 127.0.0.3 for the client)",
    )
    p.add_argument(
        "--nic-port",
        type=port_number,
        default=LINK_UDP_PORT,
        help="NIC UDP port (default %(default)s; tshark -d udp.port==PORT,vxlan decodes it)",
    )
    p.add_argument(
        "--rate",
        type=nonnegative_float,
        default=100.0,
        help="emulated link rate in Gbit/s, 0 = unpaced (default 100)",
    )
    p.add_argument("--loss", type=probability, default=0.0, help="link loss probability")
    p.add_argument(
        "--duplicate", type=probability, default=0.0, help="link duplication probability"
    )
    p.add_argument("--reorder", type=probability, default=0.0, help="link reordering probability")
    p.add_argument(
        "--corrupt", type=probability, default=0.0, help="link bit-corruption probability"
    )
    p.add_argument(
        "--delay-us",
        type=nonnegative_float,
        help="one-way link delay, emulated microseconds (default 0; on the event engine 1)",
    )
    add_run_options(
        p,
        Clock.WALL,
        "exact needs it on both sides, the server keeps the run (default wall, as "
        "perftest on real NICs)",
        virtual="both sides in this process in virtual time (no SERVER); the server's output, "
        "then the client's",
        tdf="time-dilation factor: one emulated second lasts TDF real seconds (default 200)",
        tdf_default=200.0,
        workers=None,
        pace=False,
        payload=False,
    )
    p.add_argument("--seed", type=int, default=1, help="seed of the link's fault injection")
    p.add_argument("--pcap", help="write this NIC's frames (both directions) to a pcap file")
    p.add_argument(
        "--metrics-port",
        type=nonnegative_int,
        default=0,
        help="serve Prometheus metrics on NIC-ADDR:PORT while running",
    )
    p.add_argument(
        "--connect-timeout",
        type=positive_float,
        default=60.0,
        help="wall seconds to wait for the peer (default 60)",
    )
    _familiar_flags(p)
    p.set_defaults(test=PERFTESTS[name])


def _familiar_flags(p: argparse.ArgumentParser) -> None:
    """perftest's flags that name hardware or modes the emulator has no use for: accepted, so
    a command line from a real cluster runs as it is, and named in a note when used."""
    g = p.add_argument_group("perftest flags accepted and ignored (named in a note when given)")
    g.add_argument("-d", "--ib-dev", metavar="DEV", help="the device: the emulated NIC is the one")
    g.add_argument("-i", "--ib-port", type=int, metavar="N", help="the port: one per NIC")
    g.add_argument("-x", "--gid-index", type=int, metavar="N", help="the GID: one per NIC")
    g.add_argument("-F", "--CPU-freq", action="store_true", help="no CPU-frequency check here")
    g.add_argument("-R", "--rdma_cm", action="store_true", help="QPs connect over msgpack/TCP")
    g.add_argument("-b", "--bidirectional", action="store_true", help="not emulated")
    g.add_argument("--run_infinitely", action="store_true", help="not emulated: use -D")


IGNORED = (
    "ib_dev",
    "ib_port",
    "gid_index",
    "CPU_freq",
    "rdma_cm",
    "bidirectional",
    "run_infinitely",
)


def _note_ignored(args: argparse.Namespace) -> None:
    given = [name for name in IGNORED if getattr(args, name)]
    if given:
        flags = ", ".join("--" + name.replace("_", "-") for name in given)
        print(f"# note: {flags} accepted and ignored by the emulator", file=sys.stderr)


ENGINE_REFUSES = (  # the wall clock's: the pair's link on the engine has a rate, delay, loss
    ("duplicate", "--duplicate"),
    ("reorder", "--reorder"),
    ("corrupt", "--corrupt"),
    ("pcap", "--pcap"),
    ("metrics_port", "--metrics-port"),
    ("nic_addr", "--nic-addr"),
)


def _options(args: argparse.Namespace) -> PerftestOptions:
    clock = run_options(args, job=False).clock
    engine = clock is not Clock.WALL
    if args.virtual and args.server is not None:
        raise ValueError("--virtual runs both sides in this process: give no SERVER")
    if engine:
        for attr, flag in ENGINE_REFUSES:
            if getattr(args, attr):
                raise ValueError(f"{flag} is the wall clock's (--clock wall), not the engine's")
    delay_us = args.delay_us if args.delay_us is not None else (1.0 if engine else 0.0)
    faults = LinkFaults(
        loss=args.loss,
        duplicate=args.duplicate,
        reorder=args.reorder,
        corrupt=args.corrupt,
        delay=delay_us * 1e-6 if not engine else 0.0,
        seed=args.seed,
    )
    nic_addr = args.nic_addr or ("127.0.0.2" if args.server is None else "127.0.0.3")
    return PerftestOptions(
        test=args.test,
        server=args.server,
        oob_port=args.port,
        oob_addr=args.oob_addr,
        size=args.size,
        iters=args.iters,
        duration=args.duration,
        all_sizes=args.all,
        qps=args.qp,
        mtu=args.mtu,
        report_gbits=args.report_gbits,
        tx_depth=args.tx_depth,
        nic_addr=nic_addr,
        nic_port=args.nic_port,
        rate_gbps=args.rate,
        tdf=args.tdf,
        faults=faults,
        pcap=args.pcap,
        metrics_port=args.metrics_port,
        qp_timeout=args.qp_timeout,
        retry_cnt=args.retry_cnt,
        connect_timeout=args.connect_timeout,
        clock=clock,
        delay_us=delay_us,
    )


def _run(args: argparse.Namespace) -> int:
    _note_ignored(args)
    opts = _options(args)
    if opts.clock is Clock.WALL:
        return trio.run(run_perftest, opts)
    return run_pair(opts)


for _name in PERFTESTS:
    register(
        Command(
            _name,
            f"perftest ib_{_name.replace('-', '_')} over the emulated NIC",
            partial(_configure, name=_name),
            _run,
            description="Run without SERVER to be the server; with SERVER (the server's "
            "out-of-band address) to be the client; --virtual for both in one process. Figures "
            "are emulated.",
        )
    )
