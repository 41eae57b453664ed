"""Flow jobs: a list of RDMA WRITE flows between hosts, as the HPCC simulator's flow files.

Flow files are TOML (``[[flow]]`` with src, dst, size, and optionally start_us and dscp).
:func:`run_flows` runs them on in-process host agents (virtual mode); :class:`FlowsJob` on a
fabric of node processes, through each source host's control port.
"""

from __future__ import annotations

import tomllib
from dataclasses import asdict
from pathlib import Path
from typing import Any

import trio

from rocev2_emu.control import auth
from rocev2_emu.fabric.agent import CONTROL_PORT, FlowPeer, FlowResult, FlowSpec, HostAgent
from rocev2_emu.fabric.control import control
from rocev2_emu.fabric.report import merge_stats
from rocev2_emu.runtime.clock import DilatedClock
from rocev2_emu.topology.model import NodeKind, Topology, TopologyError
from rocev2_emu.verbs.oob import OobChannel

FLOW_KEYS = frozenset({"src", "dst", "size", "start_us", "dscp"})


def load_flows(path: str | Path, topo: Topology) -> list[FlowSpec]:
    """The ``[[flow]]`` tables of a flows file, each checked as strictly as a topology file:
    unknown keys, missing or wrong values and a flow from a host to itself are errors naming
    the file, the flow and the key."""
    try:
        data = tomllib.loads(Path(path).read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise TopologyError(f"{path}: cannot read flows: {exc}") from exc
    unknown = sorted(set(data) - {"flow"})
    if unknown:
        raise TopologyError(f"{path}: unknown section(s) {unknown} (a flows file has [[flow]])")
    items = data.get("flow", [])
    if not isinstance(items, list):
        raise TopologyError(f"{path}: flow must be an array of tables ([[flow]])")
    flows = []
    for i, item in enumerate(items):
        where = f"{path}: [[flow]] #{i + 1}"
        if not isinstance(item, dict):
            raise TopologyError(f"{where}: must be a table")
        extra = sorted(set(item) - FLOW_KEYS)
        if extra:
            raise TopologyError(f"{where}: unknown key(s) {extra} (known: {sorted(FLOW_KEYS)})")
        for end in ("src", "dst"):
            node = topo.nodes.get(item.get(end, ""))
            if node is None or node.kind is not NodeKind.HOST:
                raise TopologyError(f"{where} {end} = {item.get(end)!r}: no such host")
        if item["src"] == item["dst"]:
            raise TopologyError(f"{where} dst = {item['dst']!r}: a flow needs two different hosts")
        size = item.get("size")
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise TopologyError(f"{where} size = {size!r}: must be an integer >= 0")
        start = item.get("start_us", 0.0)
        if not isinstance(start, int | float) or isinstance(start, bool) or not 0 <= start < 1e12:
            raise TopologyError(f"{where} start_us = {start!r}: must be a number >= 0")
        dscp = item.get("dscp", 26)
        if not isinstance(dscp, int) or isinstance(dscp, bool) or not 0 <= dscp < 64:
            raise TopologyError(f"{where} dscp = {dscp!r}: must be an integer 0..63")
        flows.append(FlowSpec(i, item["src"], item["dst"], size, float(start) * 1e-6, dscp))
    if not flows:
        raise TopologyError(f"{path}: no [[flow]] entries")
    return flows


async def run_flows(
    agents: dict[str, HostAgent], flows: list[FlowSpec], t0: float
) -> list[FlowResult]:
    """Open every flow, one at a time in the order of their ids (so each NIC draws its QPNs in
    the same order in every mode), then each source host runs its flows, concurrently, toward
    in-process peers."""
    peers: dict[str, FlowPeer] = dict(agents)
    for spec in sorted(flows, key=lambda f: f.id):
        await agents[spec.src].open_flow(spec, peers[spec.dst])
    results: list[FlowResult] = []

    async def source(name: str) -> None:
        results.extend(await agents[name].run_open_flows(t0))

    async with trio.open_nursery() as jobs:
        for name in sorted({f.src for f in flows}):
            jobs.start_soon(source, name)
    return sorted(results, key=lambda r: r.id)


class FlowsJob:
    """The flows on a fabric of node processes: each source host's agent runs its own."""

    def __init__(self, flows: list[FlowSpec]) -> None:
        self.flows = flows

    async def run(
        self, topo: Topology, tdf: float, epoch: float
    ) -> tuple[list[FlowResult], dict[str, Any]]:
        clock = DilatedClock(tdf, epoch=epoch)
        t0 = clock.now() + 0.5 / tdf  # half a real second from now, in emulated time
        peers = {h.name: (h.address, CONTROL_PORT) for h in topo.hosts}
        results: list[FlowResult] = []

        async def source(name: str, specs: list[FlowSpec]) -> None:
            address = topo.nodes[name].address
            chan = await OobChannel.connect(
                address, CONTROL_PORT, timeout=30, secret=auth.current()
            )
            chan.timeout = 3600.0
            try:
                await chan.send(
                    {
                        "cmd": "run_flows",
                        "flows": [asdict(s) for s in specs],
                        "peers": peers,
                        "t0": t0,
                    }
                )
                reply = await chan.recv()
            finally:
                await chan.aclose()
            if "error" in reply:
                raise RuntimeError(f"host {name}: {reply['error']}")
            results.extend(FlowResult(**r) for r in reply["results"])

        async with trio.open_nursery() as jobs:
            for name in sorted({f.src for f in self.flows}):
                jobs.start_soon(source, name, [f for f in self.flows if f.src == name])
        stats = {n.name: await control(n.address, {"cmd": "stats"}) for n in topo.nodes.values()}
        return sorted(results, key=lambda r: r.id), merge_stats(stats)

    async def node_died(self, name: str, code: int) -> bool:
        return False
