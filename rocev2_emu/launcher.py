"""``rocev2-emu up``: bring a topology to life, run a flow list on it, report, and stop.

Local mode (the default) starts one ``rocev2-emu node`` process per switch and host, each on its
own 127.10.x.y address, waits until every one prints READY (with a deadline), prints where each
serves metrics, then either runs the flows and exits with their verdict, or waits for Ctrl-C.
If any node dies, it says which and why (its last stderr lines) and stops the rest.

``--virtual`` runs the same topology in this one process under trio's MockClock with in-memory
links: the same sans-IO cores and drivers, time that jumps from event to event, and the same
result for the same seed every time.

Flow files are TOML (``[[flow]]`` with src, dst, size, and optionally start_us and dscp), the
HPCC simulator's flow lists in another syntax.
"""

from __future__ import annotations

import math
import os
import statistics
import subprocess
import sys
import time
import tomllib
from collections import deque
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Any, Protocol

import trio
import trio.abc
import trio.testing

from rocev2_emu.agent import (
    CONTROL_PORT,
    FlowPeer,
    FlowResult,
    FlowSpec,
    HostAgent,
    host_stats,
)
from rocev2_emu.clock import DilatedClock
from rocev2_emu.ethernet import VXLAN_UDP_PORT
from rocev2_emu.link import LinkFaults
from rocev2_emu.node import METRICS_PORT, host_agent, host_config, switch_driver, switch_stats
from rocev2_emu.oob import OobChannel
from rocev2_emu.ports import MemoryNetwork
from rocev2_emu.topology import Topology, TopologyError
from rocev2_emu.verbs import Context
from switch.driver import SwitchDriver

READY_TIMEOUT = 60.0


def load_flows(path: str | Path, topo: Topology) -> list[FlowSpec]:
    try:
        data = tomllib.loads(Path(path).read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise TopologyError(f"{path}: cannot read flows: {exc}") from exc
    flows = []
    for i, item in enumerate(data.get("flow", [])):
        where = f"{path}: [[flow]] #{i + 1}"
        for end in ("src", "dst"):
            node = topo.nodes.get(item.get(end, ""))
            if node is None or node.kind != "host":
                raise TopologyError(f"{where} {end} = {item.get(end)!r}: no such host")
        size = item.get("size")
        if not isinstance(size, int) or size < 0:
            raise TopologyError(f"{where} size = {size!r}: must be an integer >= 0")
        flows.append(
            FlowSpec(
                i,
                item["src"],
                item["dst"],
                size,
                float(item.get("start_us", 0.0)) * 1e-6,
                int(item.get("dscp", 26)),
            )
        )
    if not flows:
        raise TopologyError(f"{path}: no [[flow]] entries")
    return flows


def report(
    topo: Topology, tdf: float, mode: str, results: list[FlowResult], fabric: dict[str, Any]
) -> int:
    """Print the flows' completion times and the fabric's counters; the exit code."""
    print(
        f"# {topo.name}: {len(topo.hosts)} hosts, {len(topo.switches)} switches, {mode}, "
        f"TDF {tdf:g}; times are emulated"
    )
    print(
        f"{'flow':>5} {'src':>8} {'dst':>8} {'bytes':>10} {'start(us)':>10} {'FCT(us)':>10} "
        f"{'Gbit/s':>8}  status"
    )
    for r in results:
        gbps = r.size * 8 / r.fct / 1e9 if r.fct else 0.0
        ok = "ok, verified" if r.verified else r.status
        print(
            f"{r.id:>5} {r.src:>8} {r.dst:>8} {r.size:>10} {r.start * 1e6:>10.1f} "
            f"{r.fct * 1e6:>10.1f} {gbps:>8.2f}  {ok}"
        )
    fcts = sorted(r.fct for r in results if r.verified)
    if fcts:
        p99 = fcts[min(len(fcts) - 1, math.ceil(len(fcts) * 0.99) - 1)]
        print(
            f"# FCT p50 {statistics.median(fcts) * 1e6:.1f} us, p99 {p99 * 1e6:.1f} us, "
            f"max {fcts[-1] * 1e6:.1f} us"
        )
    drops = fabric.get("drops", {})
    print(
        f"# fabric: PFC frames sent {fabric.get('pfc_tx', 0)}, paused "
        f"{fabric.get('paused_seconds', 0.0) * 1e6:.1f} us (port-priority total), ECN marks "
        f"{fabric.get('ecn_marked', 0)}, drops {sum(drops.values())} {dict(drops) or ''}, "
        f"watchdog storms {fabric.get('storms', 0)}, late wake-ups "
        f"{fabric.get('late_wakeups', 0)}, socket drops {fabric.get('socket_drops', 0)}"
    )
    print(
        f"# hosts: PFC pauses honoured {fabric.get('nic_pauses', 0)}, CNPs sent "
        f"{fabric.get('cnps_sent', 0)} and handled {fabric.get('cnps_handled', 0)}, "
        f"retransmitted packets "
        f"{fabric.get('retransmitted', 0)}, ACK timeouts {fabric.get('timeouts', 0)}, "
        f"frames dropped by NICs {fabric.get('nic_drops', 0)}"
    )
    if fabric.get("late_wakeups") or fabric.get("socket_drops"):
        print(
            f"# warning: switches fell behind at TDF {tdf:g} (late wake-ups, or frames the "
            "kernel dropped): this run was not faithful; raise the TDF",
            file=sys.stderr,
        )
    failed = [r for r in results if not r.verified]
    if failed:
        print(f"# {len(failed)} flow(s) failed", file=sys.stderr)
    return 1 if failed else 0


def _merge(stats: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Fabric totals of every node's counters, plus ``pfc_senders``: the nodes that sent
    PFC pause frames (how far a pause spread)."""
    total: dict[str, Any] = {"drops": {}}
    total["pfc_senders"] = sorted(name for name, s in stats.items() if s.get("pfc_tx"))
    total["switch_tx_bytes"] = {name: s["tx_bytes"] for name, s in stats.items() if "tx_bytes" in s}
    for s in stats.values():
        for key, value in s.items():
            if key in ("down_vnis", "switch_tx_bytes"):
                continue
            if key == "drops":
                for reason, n in value.items():
                    total["drops"][reason] = total["drops"].get(reason, 0) + n
            else:
                total[key] = total.get(key, 0) + value
    return total


# -- virtual mode ------------------------------------------------------------------------


@asynccontextmanager
async def virtual_fabric(
    topo: Topology,
) -> AsyncIterator[tuple[dict[str, SwitchDriver], dict[str, HostAgent]]]:
    """Every switch and host of ``topo`` in this process on in-memory links, with the same
    cores, drivers and agents as real processes; use under MockClock for virtual time."""
    net = MemoryNetwork()
    drivers: dict[str, SwitchDriver] = {}
    agents: dict[str, HostAgent] = {}
    async with trio.open_nursery() as nursery, AsyncExitStack() as stack:
        for sw in topo.switches:
            port = net.port((sw.address, VXLAN_UDP_PORT))
            drivers[sw.name] = switch_driver(topo, sw.name, port, DilatedClock(1.0))
            await nursery.start(drivers[sw.name].run)
        for h in topo.hosts:
            cfg = host_config(topo, h.name, 1.0, None, seeded=True)
            assert cfg.link_peer is not None
            port = net.port((h.address, VXLAN_UDP_PORT), cfg.link_peer)
            ctx = await stack.enter_async_context(Context.open(cfg, port=port))
            agents[h.name] = host_agent(topo, ctx, h.name)
        try:
            yield drivers, agents
        finally:
            nursery.cancel_scope.cancel()


async def run_flows(
    agents: dict[str, HostAgent], flows: list[FlowSpec], t0: float
) -> list[FlowResult]:
    """Each source host runs its flows (concurrently), toward in-process peers."""
    peers: dict[str, FlowPeer] = dict(agents)
    results: list[FlowResult] = []

    async def source(name: str, specs: list[FlowSpec]) -> None:
        results.extend(await agents[name].run_flows(specs, peers, t0))

    async with trio.open_nursery() as jobs:
        for name in sorted({f.src for f in flows}):
            jobs.start_soon(source, name, [f for f in flows if f.src == name])
    return sorted(results, key=lambda r: r.id)


def fabric_stats(drivers: dict[str, SwitchDriver], agents: dict[str, HostAgent]) -> dict[str, Any]:
    return _merge(
        {name: switch_stats(d) for name, d in drivers.items()}
        | {name: host_stats(a.ctx) for name, a in agents.items()}
    )


async def _virtual(
    topo: Topology, flows: list[FlowSpec]
) -> tuple[list[FlowResult], dict[str, Any]]:
    async with virtual_fabric(topo) as (drivers, agents):
        t0 = next(iter(agents.values())).ctx.now() + 1e-3
        results = await run_flows(agents, flows, t0)
        return results, fabric_stats(drivers, agents)


def deterministic_trio(seed: int) -> None:
    """Trio shuffles runnable tasks on purpose; seed that shuffle (the hook trio keeps for
    deterministic test runners) so a virtual run repeats exactly for the same seed."""
    run: Any = sys.modules["trio._core._run"]
    if hasattr(run, "_ALLOW_DETERMINISTIC_SCHEDULING") and hasattr(run, "_r"):
        run._ALLOW_DETERMINISTIC_SCHEDULING = True
        run._r.seed(seed)


def run_virtual(topo: Topology, flows: list[FlowSpec]) -> int:
    deterministic_trio(topo.seed)
    results, fabric = trio.run(
        _virtual, topo, flows, clock=trio.testing.MockClock(autojump_threshold=0)
    )
    return report(topo, 1.0, "virtual time (one process, in-memory links)", results, fabric)


# -- local mode: one process per node ----------------------------------------------------


async def _read_ready(name: str, proc: trio.Process, ready: dict[str, str]) -> None:
    assert proc.stdout is not None
    buf = b""
    while b"\n" not in buf:
        chunk = await proc.stdout.receive_some(4096)
        if not chunk:
            raise RuntimeError(f"node {name} exited before it was ready (code {proc.poll()})")
        buf += chunk
    line = buf.split(b"\n", 1)[0].decode()
    if not line.startswith("READY "):
        raise RuntimeError(f"node {name} said {line!r} instead of READY")
    ready[name] = line


async def _drain(stream: trio.abc.ReceiveStream | None, tail: deque[str]) -> None:
    """Keep a node's pipe flowing (a full pipe would stall it) and remember its last lines."""
    if stream is None:
        return
    while chunk := await stream.receive_some(65536):
        tail.extend(chunk.decode(errors="replace").splitlines())


class FabricJob(Protocol):
    """What runs on a fabric of node processes once every node is ready."""

    async def run(self, topo: Topology, tdf: float, epoch: float) -> Any: ...

    async def node_died(self, name: str, code: int) -> bool:
        """Told that a node died; True if the job copes (else the fabric stops)."""
        ...


class FlowsJob:
    def __init__(self, flows: list[FlowSpec]) -> None:
        self.flows = flows

    async def run(
        self, topo: Topology, tdf: float, epoch: float
    ) -> tuple[list[FlowResult], dict[str, Any]]:
        return await _run_job(topo, tdf, epoch, self.flows)

    async def node_died(self, name: str, code: int) -> bool:
        return False


async def _watch(
    name: str,
    proc: trio.Process,
    tail: deque[str],
    stopping: trio.Event,
    scope: trio.CancelScope,
    job: FabricJob | None,
) -> None:
    code = await proc.wait()
    if not stopping.is_set():
        await trio.sleep(0.2)  # let the drain task collect the last words
        why = "\n".join(tail)
        if job is not None and await job.node_died(name, code):
            print(f"rocev2-emu: node {name} died with code {code}", file=sys.stderr)
            return
        print(
            f"rocev2-emu up: node {name} died with code {code}; stopping the fabric"
            + (f"\n{why}" if why else ""),
            file=sys.stderr,
        )
        scope.cancel()


async def _local(
    topo: Topology, topo_path: str, tdf: float, job: FabricJob | None, quiet: bool = False
) -> Any:
    """Start every node, run ``job`` (or wait for Ctrl-C), stop; the job's outcome (None when
    a node died and the job could not go on)."""
    epoch = time.monotonic()
    procs: dict[str, trio.Process] = {}
    stopping = trio.Event()
    outcome: Any = None
    try:
        async with trio.open_nursery() as nursery:
            tails: dict[str, deque[str]] = {}
            for name in topo.nodes:
                procs[name] = await trio.lowlevel.open_process(
                    [
                        sys.executable,
                        "-m",
                        "rocev2_emu",
                        "node",
                        topo_path,
                        name,
                        "--tdf",
                        str(tdf),
                        "--epoch",
                        repr(epoch),
                        "--parent-pid",
                        str(os.getpid()),
                    ],
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                )
                tails[name] = deque(maxlen=8)
                nursery.start_soon(_drain, procs[name].stderr, tails[name])
            ready: dict[str, str] = {}
            try:
                with trio.fail_after(READY_TIMEOUT):
                    async with trio.open_nursery() as waiting:
                        for name, proc in procs.items():
                            waiting.start_soon(_read_ready, name, proc, ready)
            except (trio.TooSlowError, BaseExceptionGroup) as exc:
                await trio.sleep(0.3)
                missing = sorted(set(procs) - set(ready))
                for name in missing:
                    print(
                        f"rocev2-emu up: node {name} not ready: " + " | ".join(tails[name]),
                        file=sys.stderr,
                    )
                raise RuntimeError(
                    f"nodes not ready within {READY_TIMEOUT:g} s: {missing}"
                ) from exc
            for name, proc in procs.items():
                nursery.start_soon(_drain, proc.stdout, deque(maxlen=1))
                nursery.start_soon(
                    _watch, name, proc, tails[name], stopping, nursery.cancel_scope, job
                )
            if not quiet:
                print(f"# {topo.name}: {len(procs)} node processes ready at TDF {tdf:g}")
                for name in topo.nodes:
                    print(f"  {name:>10}  {ready[name].split(' ', 2)[2]}")
            if job is None:
                print("# Ctrl-C stops the fabric", flush=True)
                await trio.sleep_forever()
            else:
                outcome = await job.run(topo, tdf, epoch)
            stopping.set()
            nursery.cancel_scope.cancel()
    finally:
        stopping.set()
        await _stop(procs)
    return outcome


async def _run_job(
    topo: Topology, tdf: float, epoch: float, flows: list[FlowSpec]
) -> tuple[list[FlowResult], dict[str, Any]]:
    clock = DilatedClock(tdf, epoch=epoch)
    t0 = clock.now() + 0.5 / tdf  # half a real second from now, in emulated time
    peers = {h.name: (h.address, CONTROL_PORT) for h in topo.hosts}
    results: list[FlowResult] = []

    async def source(name: str, specs: list[FlowSpec]) -> None:
        chan = await OobChannel.connect(topo.nodes[name].address, CONTROL_PORT, timeout=30)
        chan.timeout = 3600.0
        try:
            await chan.send(
                {"cmd": "run_flows", "flows": [asdict(s) for s in specs], "peers": peers, "t0": t0}
            )
            reply = await chan.recv()
        finally:
            await chan.aclose()
        if "error" in reply:
            raise RuntimeError(f"host {name}: {reply['error']}")
        results.extend(FlowResult(**r) for r in reply["results"])

    async with trio.open_nursery() as jobs:
        for name in sorted({f.src for f in flows}):
            jobs.start_soon(source, name, [f for f in flows if f.src == name])
    stats = {n.name: await _control(n.address, {"cmd": "stats"}) for n in topo.nodes.values()}
    return sorted(results, key=lambda r: r.id), _merge(stats)


def run_local(
    topo: Topology, topo_path: str, tdf: float, flows: list[FlowSpec]
) -> tuple[list[FlowResult], dict[str, Any]]:
    """One process per node, one job, then stop: the flows' results and the fabric's counters."""
    outcome = trio.run(_local, topo, topo_path, tdf, FlowsJob(flows), True)
    if outcome is None:
        raise RuntimeError("a node died during the job")
    assert isinstance(outcome, tuple)
    return outcome


def run_processes(
    topo: Topology, topo_path: str, tdf: float, job: FabricJob, *, quiet: bool = True
) -> Any:
    """One process per node, ``job``, then stop; what the job returned (None: a node died and
    the job could not go on)."""
    return trio.run(_local, topo, topo_path, tdf, job, quiet)


async def _stop(procs: dict[str, trio.Process]) -> None:
    for proc in procs.values():
        if proc.returncode is None:
            proc.terminate()
    with trio.move_on_after(10):
        for proc in procs.values():
            await proc.wait()
    for proc in procs.values():
        if proc.returncode is None:
            proc.kill()


def up(
    topo: Topology,
    topo_path: str,
    *,
    tdf: float | None = None,
    flows_path: str | None = None,
    virtual: bool = False,
) -> int:
    flows = load_flows(flows_path, topo) if flows_path else None
    if virtual:
        if flows is None:
            raise TopologyError("--virtual needs --flows: a virtual fabric only lives for a job")
        return run_virtual(topo, flows)
    tdf = tdf or topo.tdf
    try:
        outcome = trio.run(_local, topo, topo_path, tdf, FlowsJob(flows) if flows else None)
    except KeyboardInterrupt:
        return 130
    except BaseExceptionGroup as group:
        if group.subgroup(KeyboardInterrupt) is not None:
            print("rocev2-emu up: stopped", file=sys.stderr)
            return 130  # Ctrl-C: every node has been stopped on the way out
        raise
    if outcome is None:
        return 1  # a node died; _watch said which
    return report(topo, tdf, "local processes", *outcome)


async def _control(address: str, msg: dict[str, Any]) -> Any:
    chan = await OobChannel.connect(address, CONTROL_PORT, timeout=10)
    try:
        await chan.send(msg)
        return await chan.recv()
    finally:
        await chan.aclose()


async def _set_link(topo: Topology, a: str, b: str, up: bool) -> str:
    link = next((lk for lk in topo.links if {lk.a, lk.b} == {a, b}), None)
    if link is None:
        raise TopologyError(f"{topo.path}: no link between {a!r} and {b!r}")
    down: set[int] = set()
    for sw in topo.switches:  # the fabric's state lives in its switches
        stats = await _control(sw.address, {"cmd": "stats"})
        down |= {vni - 1 for vni in stats.get("down_vnis", [])}
    (down.discard if up else down.add)(link.index)
    for end in (a, b):
        node = topo.nodes[end]
        if node.kind == "switch":
            port = next(i for i, (lk, _) in enumerate(node.ports) if lk is link)
            await _control(node.address, {"cmd": "set_link", "port": port, "up": up})
    for sw in topo.switches:  # routing converges around the failure
        routes = topo.routes_by_ip(sw.name, frozenset(down))
        await _control(sw.address, {"cmd": "set_routes", "routes": list(routes.items())})
    state = "up" if up else "down"
    return f"link {a} <-> {b} (VNI {link.vni}) is {state}; {len(down)} link(s) down in the fabric"


def set_link(topo: Topology, a: str, b: str, up: bool) -> int:
    """``rocev2-emu link``: take a link of a running fabric down or up, and reroute."""
    print(trio.run(_set_link, topo, a, b, up))
    return 0


async def _set_faults(topo: Topology, a: str, b: str, faults: dict[str, float]) -> str:
    link = next((lk for lk in topo.links if {lk.a, lk.b} == {a, b}), None)
    if link is None:
        raise TopologyError(f"{topo.path}: no link between {a!r} and {b!r}")
    settings: dict[str, Any] = {
        "loss": link.loss,
        "delay": link.delay,
        "seed": topo.seed * 1000 + link.index,
    }
    settings.update(faults)
    LinkFaults(**settings)  # validate before touching the fabric
    for end in (a, b):
        node = topo.nodes[end]
        msg: dict[str, Any] = {"cmd": "set_faults", "faults": settings}
        if node.kind == "switch":
            msg["port"] = next(i for i, (lk, _) in enumerate(node.ports) if lk is link)
        reply = await _control(node.address, msg)
        if "error" in reply:
            raise RuntimeError(f"{end}: {reply['error']}")
    shown = ", ".join(f"{k} {v:g}" for k, v in sorted(faults.items()))
    return f"link {a} <-> {b} (VNI {link.vni}): {shown}, both directions"


def stop_node(topo: Topology, name: str) -> int:
    """``rocev2-emu stop``: end one node of a running fabric (as a crash or docker stop)."""
    if name not in topo.nodes:
        raise TopologyError(f"{topo.path}: no node named {name!r}")
    reply = trio.run(_control, topo.nodes[name].address, {"cmd": "stop"})
    if not isinstance(reply, dict) or not reply.get("ok"):
        raise RuntimeError(f"node {name}: {reply!r}")
    print(f"node {name} (pid {reply['pid']}) is stopping")
    return 0


def set_faults(topo: Topology, a: str, b: str, faults: dict[str, float]) -> int:
    """``rocev2-emu link A B --loss P ...``: change a running link's faults, both ends."""
    print(trio.run(_set_faults, topo, a, b, faults))
    return 0


__all__ = ["METRICS_PORT", "load_flows", "report", "run_virtual", "set_faults", "set_link", "up"]
