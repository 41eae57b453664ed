"""The ``rocev2-emu`` command line: the demo, perftest-style tests and benchmarks.

Subcommands::

    rocev2-emu demo                         all-reduce on the shipped leaf-spine (processes)
    rocev2-emu demo --perftest              two NIC processes on 127.0.0.2/.3: write-bw, write-lat
    rocev2-emu write-bw [SERVER] [flags]    perftest ib_write_bw (server without SERVER)
    rocev2-emu write-lat | send-bw | read-bw
    rocev2-emu up TOPOLOGY [--flows F] [--virtual]   a fabric: switches and hosts, a job
    rocev2-emu node TOPOLOGY NAME           one switch or host of a topology (used by up)
    rocev2-emu topology SHAPE [...]         generate a topology file
    rocev2-emu compose TOPOLOGY [--out D]   the docker-compose testbed for a topology
    rocev2-emu link TOPOLOGY A B down|up    take a link of a running fabric down or up
    rocev2-emu stop TOPOLOGY NODE           stop one node of a running fabric
    rocev2-emu bench udp-baseline|write-bw|switch   datagram-rate figures (no assertions)
    rocev2-emu bench all-reduce|all-gather|reduce-scatter|broadcast   nccl-tests' table

Every figure is in emulated units and states the TDF it ran at.
"""

from __future__ import annotations

import argparse
import logging
import subprocess
import sys
import time

import trio

from rocev2_emu import __version__
from rocev2_emu.errors import VerbsError
from rocev2_emu.link import LinkFaults
from rocev2_emu.oob import DEFAULT_OOB_PORT
from rocev2_emu.perftest import PerftestError, PerftestOptions
from rocev2_emu.perftest import run as run_perftest

PERFTESTS = {
    "write-bw": "write_bw",
    "write-lat": "write_lat",
    "send-bw": "send_bw",
    "read-bw": "read_bw",
}


def _perftest_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser], name: str) -> None:
    lat = name == "write-lat"
    p = sub.add_parser(
        name,
        help=f"perftest ib_{name.replace('-', '_')} over the emulated NIC",
        description="Run without SERVER to be the server; with SERVER (the "
        "server's out-of-band address) to be the client. Figures are emulated.",
    )
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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rocev2-emu",
        description="A RoCEv2 fabric that really runs: software NICs "
        "speaking real RoCEv2 frames between processes.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser(
        "demo",
        help="the all-reduce benchmark on the shipped leaf-spine, one process per node, with "
        "metrics (--perftest: write-bw and write-lat between two NICs)",
    )
    demo.add_argument("--perftest", action="store_true", help="the two-NIC perftest demo instead")
    demo.add_argument("--tdf", type=float, help="time-dilation factor (default: the topology's)")
    demo.add_argument("--loss", type=float, default=0.0, help="link loss probability")
    for name in PERFTESTS:
        _perftest_parser(sub, name)
    up = sub.add_parser(
        "up",
        help="run a topology: one process per switch and host "
        "(or --virtual), optionally a flow list, then report",
    )
    up.add_argument("topology", help="topology TOML file (see examples/topologies)")
    up.add_argument("--flows", help="flow list TOML ([[flow]] src, dst, size, start_us, dscp)")
    up.add_argument(
        "--virtual",
        action="store_true",
        help="one process in virtual time (deterministic; needs --flows)",
    )
    up.add_argument("--tdf", type=float, help="override the topology's time-dilation factor")
    node = sub.add_parser("node", help="run one switch or host of a topology (used by up)")
    node.add_argument("topology")
    node.add_argument("name")
    node.add_argument("--tdf", type=float, help="override the topology's TDF")
    node.add_argument(
        "--epoch", type=float, help="time.monotonic() at emulated time 0, shared by the fabric"
    )
    node.add_argument("--no-metrics", action="store_true", help="do not serve metrics")
    node.add_argument(
        "--metrics-addr",
        help="address /metrics listens on (default: the node's; 0.0.0.0 in a container)",
    )
    node.add_argument(
        "--parent-pid", type=int, default=0, help="exit when this process (the launcher) is gone"
    )
    link = sub.add_parser("link", help="take a link of a running fabric down or up")
    link.add_argument("topology")
    link.add_argument("a", help="one end of the link")
    link.add_argument("b", help="the other end")
    link.add_argument("state", nargs="?", choices=["down", "up"], help="take it down or up")
    link.add_argument("--loss", type=float, help="set the loss probability, both directions")
    link.add_argument("--corrupt", type=float, help="set the bit-corruption probability")
    link.add_argument("--duplicate", type=float, help="set the duplication probability")
    link.add_argument("--reorder", type=float, help="set the reordering probability")
    link.add_argument("--delay-us", type=float, help="set the one-way delay (emulated us)")
    stop = sub.add_parser("stop", help="stop one node of a running fabric (as a crash would)")
    stop.add_argument("topology")
    stop.add_argument("name")
    gen = sub.add_parser("topology", help="generate a topology file on stdout")
    gen.add_argument("shape", choices=["single-switch", "leaf-spine", "fat-tree"])
    gen.add_argument("--hosts", type=int, default=8, help="single-switch: hosts (default 8)")
    gen.add_argument("--spines", type=int, default=2, help="leaf-spine: spines (default 2)")
    gen.add_argument("--leaves", type=int, default=4, help="leaf-spine: leaves (default 4)")
    gen.add_argument("--hosts-per-leaf", type=int, default=2, help="leaf-spine (default 2)")
    gen.add_argument("-k", type=int, default=4, help="fat-tree: k (even, default 4)")
    gen.add_argument("--rate", type=float, default=100.0, help="link rate, Gbit/s")
    gen.add_argument("--delay-us", type=float, default=1.0, help="link delay, microseconds")
    gen.add_argument(
        "--tdf",
        type=float,
        help="time-dilation factor (default: the shape's, sized for this class of machine)",
    )
    comp = sub.add_parser(
        "compose", help="write the docker-compose testbed (and Prometheus config) for a topology"
    )
    comp.add_argument("topology")
    comp.add_argument("--out", default=".", help="where docker-compose.yml and deploy/ go (.)")
    comp.add_argument("--subnet", default="172.30.0.0/24", help="the bridge network's subnet")
    scen = sub.add_parser("scenario", help="run a canonical congestion experiment and check it")
    scen.add_argument(
        "name",
        help="pfc-unfairness, victim-flow, incast, fairness, fluid-model, dilation or straggler "
        "(docs/scenarios.md)",
    )
    scen.add_argument("--virtual", action="store_true", help="in virtual time (one process)")
    scen.add_argument("--seed", type=int, default=1, help="seed (default 1)")
    scen.add_argument("--out", help="directory for NAME.json and NAME.png (default .)")
    scen.add_argument(
        "--tdf", type=float, default=1000.0, help="TDF of a run with real processes (default 1000)"
    )
    bench = sub.add_parser(
        "bench", help="print figures: datagram rates, or collectives as nccl-tests does"
    )
    bench.add_argument(
        "which",
        choices=[
            "udp-baseline",
            "write-bw",
            "switch",
            "all-reduce",
            "all-gather",
            "reduce-scatter",
            "broadcast",
        ],
    )
    bench.add_argument("--seconds", type=float, default=3.0, help="length of each datagram run")
    from collectives.cli import add_arguments

    add_arguments(bench)
    return parser


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


def _demo(args: argparse.Namespace) -> int:
    if not args.perftest:
        from collectives.cli import demo

        return demo(args.tdf)
    return _perftest_demo(args.tdf or 200.0, args.loss)


def _perftest_demo(tdf: float, loss: float) -> int:
    me = [sys.executable, "-m", "rocev2_emu"]
    common = ["--tdf", str(tdf), "--loss", str(loss), "-p", "18516"]
    runs = [("write-bw", ["-s", "65536", "-n", "400"]), ("write-lat", ["-n", "200"])]
    print(
        f"rocev2-emu demo: two NIC processes, server 127.0.0.2 and client 127.0.0.3, direct "
        f"100 Gbit/s link, TDF {tdf:g}; metrics at http://127.0.0.2:9102/metrics and "
        "http://127.0.0.3:9103/metrics while each test runs\n"
    )
    for test, extra in runs:
        server = subprocess.Popen(
            [*me, test, *common, *extra, "--metrics-port", "9102", "--nic-addr", "127.0.0.2"],
            stdout=subprocess.DEVNULL,
        )
        time.sleep(0.3)
        try:
            client = subprocess.run(
                [
                    *me,
                    test,
                    "127.0.0.1",
                    *common,
                    *extra,
                    "--metrics-port",
                    "9103",
                    "--nic-addr",
                    "127.0.0.3",
                ],
                timeout=600,
            )
        finally:
            server.wait(60)
        if client.returncode or server.returncode:
            print(
                f"demo: {test} failed (client {client.returncode}, server {server.returncode})",
                file=sys.stderr,
            )
            return 1
        print()
    return 0


def _fabric_command(args: argparse.Namespace) -> int:
    from rocev2_emu import launcher, node, topogen, topology

    if args.command == "topology":
        common: dict[str, float] = {"rate_gbps": args.rate, "delay_us": args.delay_us}
        if args.tdf:
            common["tdf"] = args.tdf
        if args.shape == "single-switch":
            text = topogen.single_switch(args.hosts, **common)
        elif args.shape == "leaf-spine":
            text = topogen.leaf_spine(args.spines, args.leaves, args.hosts_per_leaf, **common)
        else:
            text = topogen.fat_tree(args.k, **common)
        print(text, end="")
        return 0
    topo = topology.resolve_names(topology.load(args.topology))  # names: docker swarm
    if args.command == "stop":
        return launcher.stop_node(topo, args.name)
    if args.command == "link":
        faults = {
            k: v
            for k, v in (
                ("loss", args.loss),
                ("corrupt", args.corrupt),
                ("duplicate", args.duplicate),
                ("reorder", args.reorder),
            )
            if v is not None
        }
        if args.delay_us is not None:
            faults["delay"] = args.delay_us * 1e-6
        if args.state is None and not faults:
            raise ValueError("say down, up, or a fault to set (--loss, --corrupt, ...)")
        if args.state is not None:
            launcher.set_link(topo, args.a, args.b, args.state == "up")
        return launcher.set_faults(topo, args.a, args.b, faults) if faults else 0
    if args.command == "node":
        opts = node.NodeOptions(
            args.tdf or topo.tdf,
            args.epoch,
            not args.no_metrics,
            args.parent_pid,
            args.metrics_addr,
        )
        trio.run(node.run_node, topo, args.name, opts)
        return 0
    return launcher.up(
        topo, args.topology, tdf=args.tdf, flows_path=args.flows, virtual=args.virtual
    )


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )
    try:
        if args.command == "demo":
            return _demo(args)
        if args.command in ("up", "node", "topology", "link", "stop"):
            return _fabric_command(args)
        if args.command == "compose":
            from rocev2_emu.compose import generate

            for path in generate(args.topology, args.out, args.subnet):
                print(f"wrote {path}")
            return 0
        if args.command == "scenario":
            from rocev2_emu import scenarios

            return scenarios.main(
                args.name, seed=args.seed, out=args.out, virtual=args.virtual, tdf=args.tdf
            )
        if args.command == "bench" and args.which in ("udp-baseline", "write-bw", "switch"):
            from rocev2_emu.bench import main as bench_main

            return bench_main(args.which, args.seconds)
        if args.command == "bench":
            from collectives.cli import main as collective_bench

            return collective_bench(args.which, args)
        return trio.run(run_perftest, _options(args))
    except (PerftestError, VerbsError, OSError, ValueError, RuntimeError) as exc:
        print(f"rocev2-emu {args.command}: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
