"""perftest's commands: ``rocev2-emu write-bw | write-lat | send-bw | read-bw``, with perftest's
main flags and output (:mod:`rocev2_emu.tools.perftest`), plus the emulator's own (link rate,
TDF, faults, pcap, metrics).  Without SERVER a command is the server; with it, the client.
"""

from __future__ import annotations

import argparse
from functools import partial

import trio

from rocev2_emu.cli.commands import Command, register
from rocev2_emu.runtime.link import LinkFaults
from rocev2_emu.tools.perftest import PerftestOptions
from rocev2_emu.tools.perftest import run as run_perftest
from rocev2_emu.verbs.oob import DEFAULT_OOB_PORT

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
        type=int,
        default=DEFAULT_OOB_PORT,
        help="out-of-band TCP port (default %(default)s)",
    )
    p.add_argument(
        "-s",
        "--size",
        type=int,
        default=2 if lat else 65536,
        help="message size in bytes (default %(default)s)",
    )
    p.add_argument(
        "-n",
        "--iters",
        type=int,
        default=1000 if lat else 5000,
        help="iterations (default %(default)s)",
    )
    p.add_argument(
        "-D",
        "--duration",
        type=float,
        default=0.0,
        help="run for this many emulated seconds instead of -n iterations",
    )
    p.add_argument("-a", "--all", action="store_true", help="all sizes from 2 B to 8 MiB")
    p.add_argument("-q", "--qp", type=int, default=1, help="number of QPs (default 1)")
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
        type=int,
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
    p.add_argument("--retry-cnt", type=int, default=7, help="transport retries (default 7)")
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
    p.add_argument("--nic-port", type=int, default=4789, help="NIC UDP port (default 4789)")
    p.add_argument(
        "--rate",
        type=float,
        default=100.0,
        help="emulated link rate in Gbit/s, 0 = unpaced (default 100)",
    )
    p.add_argument(
        "--tdf",
        type=float,
        default=200.0,
        help="time-dilation factor: one emulated second lasts TDF real seconds (default 200)",
    )
    p.add_argument("--loss", type=float, default=0.0, help="link loss probability")
    p.add_argument("--duplicate", type=float, default=0.0, help="link duplication probability")
    p.add_argument("--reorder", type=float, default=0.0, help="link reordering probability")
    p.add_argument("--corrupt", type=float, default=0.0, help="link bit-corruption probability")
    p.add_argument(
        "--delay-us", type=float, default=0.0, help="one-way link delay, emulated microseconds"
    )
    p.add_argument("--seed", type=int, default=1, help="seed of the link's fault injection")
    p.add_argument("--pcap", help="write this NIC's frames (both directions) to a pcap file")
    p.add_argument(
        "--metrics-port",
        type=int,
        default=0,
        help="serve Prometheus metrics on NIC-ADDR:PORT while running",
    )
    p.add_argument(
        "--connect-timeout",
        type=float,
        default=60.0,
        help="wall seconds to wait for the peer (default 60)",
    )
    p.set_defaults(test=PERFTESTS[name])


def _options(args: argparse.Namespace) -> PerftestOptions:
    faults = LinkFaults(
        loss=args.loss,
        duplicate=args.duplicate,
        reorder=args.reorder,
        corrupt=args.corrupt,
        delay=args.delay_us * 1e-6,
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
    )


def _run(args: argparse.Namespace) -> int:
    return trio.run(run_perftest, _options(args))


for _name in PERFTESTS:
    register(
        Command(
            _name,
            f"perftest ib_{_name.replace('-', '_')} over the emulated NIC",
            partial(_configure, name=_name),
            _run,
            description="Run without SERVER to be the server; with SERVER (the server's "
            "out-of-band address) to be the client. Figures are emulated.",
        )
    )
