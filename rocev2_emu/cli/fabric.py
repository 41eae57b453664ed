"""The fabric's commands: ``up``, ``node``, ``link``, ``stop`` and ``view``."""

from __future__ import annotations

import argparse
from functools import partial
from typing import Any

import trio

from rocev2_emu.cli.args import (
    add_run_options,
    nonnegative_float,
    run_options,
    sync_address,
    with_payload,
)
from rocev2_emu.cli.commands import Command, register
from rocev2_emu.control import auth
from rocev2_emu.fabric import blocks, control, flow_run, nodes
from rocev2_emu.fabric.exact_node import run_node_group
from rocev2_emu.fabric.options import Clock
from rocev2_emu.topology import file as topology_file
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
register(
    Command(
        "view",
        "replay a recorded run (up --ui --record FILE) in the browser, with a timeline",
        _view_args,
        _view,
    )
)
