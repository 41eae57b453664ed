"""The fabric's commands: ``up``, ``node``, ``link``, ``stop``, ``topology`` and ``compose``."""

from __future__ import annotations

import argparse
import pwd
import sys
from functools import partial
from pathlib import Path
from typing import Any

import trio

from rocev2_emu.cli.args import (
    add_run_options,
    nonnegative_float,
    positive_float,
    positive_int,
    run_options,
    sync_address,
    with_payload,
)
from rocev2_emu.cli.commands import Command, register
from rocev2_emu.control import auth
from rocev2_emu.fabric import blocks, control, flow_run, nodes
from rocev2_emu.fabric.exact_node import run_node_group
from rocev2_emu.fabric.options import Clock
from rocev2_emu.server.crossbar import DEFAULT_PRESET, PRESETS
from rocev2_emu.testbed.compose import generate
from rocev2_emu.topology import file as topology_file
from rocev2_emu.topology import generate as topogen
from rocev2_emu.topology.model import Topology


def _load(path: str) -> Topology:
    """The topology file, with node names resolved where it names nodes by DNS (swarm), on the
    block of 127/8 its running fabric took (rocev2_emu.fabric.blocks)."""
    return blocks.running(topology_file.resolve_names(topology_file.load(path)), path)


def _up_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("topology", help="topology TOML file (see examples/topologies)")
    p.add_argument("--flows", help="flow list TOML ([[flow]] src, dst, size, start_us, dscp)")
    add_run_options(p, None, "default: exact with --flows, wall for a fabric left running")
    p.add_argument("--json", metavar="FILE", help="also write the results and counters as JSON")
    p.add_argument(
        "--ui",
        nargs="?",
        const="127.0.0.1:8080",
        metavar="ADDR:PORT",
        help="serve the fabric's live map in the browser (default 127.0.0.1:8080; another "
        "address needs the steering token it prints); needs the ui extra",
    )
    p.add_argument(
        "--record",
        metavar="FILE",
        help="write the map's samples here (with --ui; or with --virtual, every 10 us of "
        "emulated time, longer above 64 nodes), for rocev2-emu view",
    )


def _up(args: argparse.Namespace) -> int:
    topo = with_payload(_load(args.topology), args.payload)
    if args.virtual and args.workers is not None and args.record:
        raise ValueError("--record samples a virtual run in one process: not with --workers")
    options = run_options(args, job=args.flows is not None)
    virtual = options.clock is Clock.VIRTUAL
    beside: Any = None
    watch: Any = None
    if args.record and not args.ui and not virtual:
        raise ValueError("--record writes what --ui samples: give --ui too (or --virtual)")
    if virtual and args.record:
        from rocev2_emu.ui.record import recorder  # the ui extra is not needed to record

        watch = recorder(topo, args.record)
    elif args.ui:
        if virtual:
            raise ValueError("--ui needs processes: a virtual run has no nodes to sample")
        from rocev2_emu.ui.server import parse_addr, serve_live  # the ui extra

        beside = partial(serve_live, topo, parse_addr(args.ui), args.record)
    return flow_run.up(
        topo,
        args.topology,
        options,
        flows_path=args.flows,
        beside=beside,
        watch=watch,
        json_out=args.json,
    )


def _view_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("recording", help="a file written by up --ui --record")
    p.add_argument("--ui", default="127.0.0.1:8080", metavar="ADDR:PORT", help="(127.0.0.1:8080)")


def _view(args: argparse.Namespace) -> int:
    from rocev2_emu.ui.server import load_recording, parse_addr, serve_replay

    load_recording(args.recording)  # a bad file fails before the server starts
    try:
        trio.run(serve_replay, args.recording, parse_addr(args.ui))
    except KeyboardInterrupt:
        return 130
    return 0


def _node_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("topology")
    p.add_argument("name", help="the node (with --clock exact and --workers: NAME,NAME,...)")
    p.add_argument(
        "--epoch", type=float, help="time.monotonic() at emulated time 0, shared by the fabric"
    )
    p.add_argument(
        "--no-metrics",
        action="store_true",
        help="do not serve metrics (the READY line then says metrics=off)",
    )
    p.add_argument(
        "--metrics-addr",
        help="address /metrics listens on (default: the node's; 0.0.0.0 in a container)",
    )
    p.add_argument(
        "--parent-pid", type=int, default=0, help="exit when this process (the launcher) is gone"
    )
    add_run_options(
        p,
        Clock.WALL,
        "exact with --sync",
        virtual=False,
        workers="with --clock exact: the run's nodes are in N processes; NAME lists this one's",
        pace=False,
    )
    p.add_argument(
        "--sync",
        type=sync_address,
        metavar="HOST:PORT",
        help="the coordinator of an exact run (--clock exact); or the path of its Unix socket "
        "(rocev2-emu up gives one to the node processes it starts)",
    )
    p.add_argument(
        "--join-timeout",
        type=nonnegative_float,
        default=0.0,
        metavar="SECONDS",
        help="with --clock exact: wait up to this long for the coordinator to listen (a "
        "container started before the job that serves it; 0: it must listen already)",
    )


def _node(args: argparse.Namespace) -> int:
    topo = with_payload(_load(args.topology), args.payload)
    opts = nodes.NodeOptions(
        args.tdf or topo.tdf, args.epoch, not args.no_metrics, args.parent_pid, args.metrics_addr
    )
    exact_only = [f for f in ("sync", "join_timeout", "workers") if getattr(args, f)]
    if args.clock != "exact" and exact_only:
        flags = ", ".join("--" + f.replace("_", "-") for f in exact_only)
        raise ValueError(f"{flags}: for a node of an exact run (--clock exact)")
    auth.use(auth.load_or_create(args.topology)[0])  # a node by hand makes the fabric's secret
    if args.clock == "exact":
        if not args.sync:
            raise ValueError("--clock exact needs --sync HOST:PORT (rocev2-emu up starts it)")
        names = args.name.split(",")
        metrics = not args.no_metrics
        run_node_group(
            topo,
            names,
            args.sync,
            metrics=metrics,
            workers=args.workers,
            metrics_addr=args.metrics_addr,
            join_timeout=args.join_timeout,
        )
        return 0
    trio.run(nodes.run_node, topo, args.name, opts)
    return 0


def _link_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("topology")
    p.add_argument("a", help="one end of the link")
    p.add_argument("b", help="the other end")
    p.add_argument(
        "state",
        nargs="?",
        choices=["down", "up"],
        help="take it down or up (on an exact run at one emulated instant, which is printed; "
        "so are fault changes there, a delay no lower than the link's own)",
    )
    p.add_argument("--loss", type=float, help="set the loss probability, both directions")
    p.add_argument("--corrupt", type=float, help="set the bit-corruption probability")
    p.add_argument("--duplicate", type=float, help="set the duplication probability")
    p.add_argument("--reorder", type=float, help="set the reordering probability")
    p.add_argument("--delay-us", type=float, help="set the one-way delay (emulated us)")


def _link(args: argparse.Namespace) -> int:
    topo = _load(args.topology)
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
        control.set_link(topo, args.a, args.b, args.state == "up")
    return control.set_faults(topo, args.a, args.b, faults) if faults else 0


def _stop_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("topology")
    p.add_argument("name")


def _stop(args: argparse.Namespace) -> int:
    return control.stop_node(_load(args.topology), args.name)


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


register(
    Command(
        "up",
        "run a topology: one process per switch and host (or --virtual), optionally a flow "
        "list, then report",
        _up_args,
        _up,
    )
)
register(Command("node", "run one switch or host of a topology (used by up)", _node_args, _node))
register(Command("link", "take a link of a running fabric down or up", _link_args, _link))
register(Command("stop", "stop one node of a running fabric (as a crash would)", _stop_args, _stop))
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
register(
    Command(
        "view",
        "replay a recorded run (up --ui --record FILE) in the browser, with a timeline",
        _view_args,
        _view,
    )
)
