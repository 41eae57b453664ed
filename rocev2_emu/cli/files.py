"""The commands that write a fabric's files: ``topology`` (a generated topology on stdout),
``compose`` (the docker-compose testbeds and the swarm stack) and ``secret`` (the control
plane's secret file)."""

from __future__ import annotations

import argparse
import pwd
import sys
from pathlib import Path

from rocev2_emu.cli.args import positive_float, positive_int
from rocev2_emu.cli.commands import Command, register
from rocev2_emu.control import auth
from rocev2_emu.server.crossbar import DEFAULT_PRESET, PRESETS
from rocev2_emu.testbed.compose import generate
from rocev2_emu.topology import generate as topogen


def _topology_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("shape", choices=["single-switch", "leaf-spine", "fat-tree", "ai-zone"])
    p.add_argument("--hosts", type=int, default=8, help="single-switch: hosts (default 8)")
    p.add_argument("--spines", type=int, default=2, help="leaf-spine: spines (default 2)")
    p.add_argument("--leaves", type=int, default=4, help="leaf-spine: leaves (default 4)")
    p.add_argument("--hosts-per-leaf", type=int, default=2, help="leaf-spine (default 2)")
    p.add_argument("-k", type=int, default=4, help="fat-tree: k (even, default 4)")
    p.add_argument(
        "--rate", type=float, help="link rate, Gbit/s (default 100; ai-zone: a host's, 400)"
    )
    p.add_argument("--delay-us", type=float, default=1.0, help="link delay, microseconds")
    p.add_argument(
        "--tdf",
        type=float,
        help="time-dilation factor (default: the shape's, sized for this class of machine)",
    )
    g = p.add_argument_group("servers")
    g.add_argument(
        "--ranks-per-host",
        type=positive_int,
        default=1,
        help="single-switch, leaf-spine, fat-tree: accelerators per server (its ranks, sharing "
        "its host's NIC; default 1)",
    )
    g.add_argument(
        "--nic-per-accelerator",
        action="store_true",
        help="single-switch, leaf-spine, fat-tree: a NIC each instead (a host per accelerator, "
        "the server's hosts under one leaf, 'server = \"sN\"')",
    )
    g.add_argument(
        "--server-fabric",
        choices=sorted(PRESETS),
        help=f"what joins a server's accelerators: {', '.join(sorted(PRESETS))} (default "
        f"{DEFAULT_PRESET}; free: copies take no time)",
    )
    _ai_zone_args(p)


def _ai_zone_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("ai-zone (Meta's AI Zone: docs/fabric.md)")
    g.add_argument("--zones", type=positive_int, default=2, help="AI zones (default 2)")
    g.add_argument("--racks", type=positive_int, default=2, help="racks per zone (default 2)")
    g.add_argument("--servers-per-rack", type=positive_int, default=1, help="(default 1)")
    g.add_argument(
        "--accelerators", type=positive_int, default=2, help="per server, a NIC each (default 2)"
    )
    g.add_argument("--ctsws", type=positive_int, default=2, help="spines per zone (default 2)")
    g.add_argument("--atsws", type=positive_int, default=1, help="aggregators (default 1)")
    g.add_argument(
        "--spare", type=positive_float, default=1.125, help="RTSW uplink / downlink (1.125)"
    )
    g.add_argument(
        "--cross-zone-oversubscription",
        type=positive_float,
        default=7.0,
        help="CTSW downlink / ATSW uplink capacity (default 7: an assumption)",
    )
    g.add_argument(
        "--rails",
        action="store_true",
        help="rail-optimized: a leaf per accelerator index, wired to that accelerator of every "
        "server of the zone",
    )
    g.add_argument(
        "--ctsw-buffer-mb",
        type=float,
        default=0.0,
        help="each CTSW's deep buffer, MiB, statically divided (0: the fabric's buffer)",
    )


def _topology(args: argparse.Namespace) -> int:
    if args.shape == "ai-zone" and (args.ranks_per_host > 1 or args.nic_per_accelerator):
        raise ValueError(
            "ai-zone: every accelerator is a host with its own NIC (--accelerators); "
            "--ranks-per-host and --nic-per-accelerator are for the other shapes"
        )
    if args.nic_per_accelerator and args.ranks_per_host < 2:
        raise ValueError("--nic-per-accelerator: give the accelerators, --ranks-per-host N >= 2")
    if args.shape == "ai-zone":
        extra: dict[str, float] = {"tdf": args.tdf} if args.tdf else {}
        print(
            topogen.ai_zone(
                args.zones,
                args.racks,
                args.servers_per_rack,
                args.accelerators,
                args.ctsws,
                args.atsws,
                host_gbps=args.rate or 400.0,
                spare=args.spare,
                cross_zone_oversubscription=args.cross_zone_oversubscription,
                ctsw_buffer_mb=args.ctsw_buffer_mb,
                rails=args.rails,
                server_fabric=args.server_fabric or DEFAULT_PRESET,
                delay_us=args.delay_us,
                **extra,
            ),
            end="",
        )
        return 0
    common: dict[str, float] = {"rate_gbps": args.rate or 100.0, "delay_us": args.delay_us}
    if args.tdf:
        common["tdf"] = args.tdf
    servers = None
    if args.ranks_per_host > 1 or args.server_fabric:
        servers = topogen.Servers(
            args.ranks_per_host, args.server_fabric or DEFAULT_PRESET, args.nic_per_accelerator
        )
    if args.shape == "single-switch":
        text = topogen.single_switch(args.hosts, **common, servers=servers)
    elif args.shape == "leaf-spine":
        text = topogen.leaf_spine(
            args.spines, args.leaves, args.hosts_per_leaf, **common, servers=servers
        )
    else:
        text = topogen.fat_tree(args.k, **common, servers=servers)
    print(text, end="")
    return 0


def _compose_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("topology")
    p.add_argument(
        "--out",
        default=".",
        help="where docker-compose.yml (the exact clock), docker-compose.wall.yml (the wall "
        "clock), docker-compose.training.yml and deploy/ go (.)",
    )
    p.add_argument("--subnet", default="172.30.0.0/24", help="the bridge network's subnet")
    p.add_argument(
        "--workers",
        type=positive_int,
        metavar="N",
        help="write only the swarm stack (deploy/docker-stack.yml and its topology), of N "
        "worker services each hosting a group of nodes as --workers groups them, not a "
        "container per node",
    )


def _compose(args: argparse.Namespace) -> int:
    for path in generate(args.topology, args.out, args.subnet, args.workers):
        print(f"wrote {path}")
    return 0


def _secret_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", help="the secret file (made, mode 0600, when it does not exist)")
    p.add_argument(
        "--share",
        metavar="PATH",
        help="also write the secret to PATH, for --user (the testbed's secret service does)",
    )
    p.add_argument("--user", default="rocev2", help="who may read the --share copy (rocev2)")


def _secret(args: argparse.Namespace) -> int:
    path = Path(args.file)
    try:
        secret, made = auth.ensure(path)
        if args.share:
            try:
                who = pwd.getpwnam(args.user)
            except KeyError:
                raise auth.AuthError(f"--user {args.user}: no such user") from None
            auth.share(secret, Path(args.share), who.pw_uid, who.pw_gid)
    except (OSError, auth.AuthError) as exc:
        print(f"rocev2-emu secret: {exc}", file=sys.stderr)
        return 1
    print(f"fabric secret: {'made' if made else 'kept'} {path}", end="")
    print(f", shared at {args.share} for {args.user}" if args.share else "")
    return 0


register(Command("topology", "generate a topology file on stdout", _topology_args, _topology))
register(
    Command(
        "compose",
        "write the docker-compose testbeds (exact and wall clock, training; Prometheus and "
        "Grafana config) for a topology",
        _compose_args,
        _compose,
    )
)
register(
    Command(
        "secret",
        "make a fabric's control-plane secret file if it has none (the testbed's secret service)",
        _secret_args,
        _secret,
    )
)
