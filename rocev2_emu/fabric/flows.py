"""Flow jobs: a list of RDMA WRITE flows between hosts, as the HPCC simulator's flow files.

Flow files are TOML (``[[flow]]`` with src, dst, size, and optionally start_us and dscp).
:func:`run_flows` runs them on in-process host agents (virtual time); :class:`FlowsJob` on a
fabric of node processes (the exact clock or the wall clock), through the sources' control
ports.
"""

from __future__ import annotations

import math
import tomllib
from dataclasses import asdict
from pathlib import Path
from typing import Any, Final

import trio

from rocev2_emu.fabric.agent import (
    FlowPeer,
    FlowResult,
    FlowSpec,
    HostAgent,
    data_digest,
    flow_data,
)
from rocev2_emu.fabric.exact import ask_node, gather
from rocev2_emu.fabric.handle import JOIN_SECONDS, fabric_for
from rocev2_emu.fabric.layout import open_batches
from rocev2_emu.runtime.coordinator import Coordinator
from rocev2_emu.topology.model import NodeKind, Topology, TopologyError

FLOW_START: Final = 1e-3  # emulated seconds: when a flow job's flows start (as in virtual time)

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
    """The flows on a fabric of node processes, on the exact clock (given the run's
    ``coordinator``) or the wall clock: opened one by one in the order of their ids (each NIC
    draws its QPNs and PSNs in that order, as in virtual time), started together at ``t0``
    (the wall clock: half a second after the start requests), their bytes checked at each
    destination afterwards (no out-of-band wait inside the run), the counters read once the
    flows are done.  On the exact clock the results and counters are the virtual run's."""

    def __init__(
        self,
        flows: list[FlowSpec],
        t0: float = FLOW_START,
        coordinator: Coordinator | None = None,
        join_timeout: float = JOIN_SECONDS,
    ) -> None:
        self.flows = flows
        self.t0 = t0
        self.coordinator = coordinator
        self.join_timeout = join_timeout  # wall seconds for an exact run's processes to join

    async def run(
        self, topo: Topology, tdf: float, epoch: float
    ) -> tuple[list[FlowResult], dict[str, Any]]:
        fabric = fabric_for(topo, tdf, epoch, self.coordinator, self.join_timeout)
        await fabric.joined()
        # a batch is a run of flows whose sources share a process (its hosts call a
        # destination there directly), each flow of a batch after the other
        for batch in open_batches(sorted(self.flows, key=lambda f: f.id), fabric.processes):
            flows = [
                {"spec": asdict(f), "dst": topo.nodes[f.dst].address}
                | ({"node": True} if topo.shares_address(f.dst) else {})
                for f in batch
            ]
            request = {"cmd": "open_flows", "flows": flows}
            await ask_node(topo, batch[0].src, request, 30 + len(flows))
        sources = sorted({f.src for f in self.flows})
        start = {"cmd": "start_flows", "t0": fabric.start_at(self.t0), "verify": False}
        await fabric.ask(sources, start)
        fabric.release()
        replies = await fabric.ask(sources, {"cmd": "flow_results"}, timeout=math.inf)
        results = [FlowResult(**r) for reply in replies.values() for r in reply["results"]]
        if not topo.timing_only:  # (timing only: the fabric carried no bytes to check)
            await self._verify(topo, results)
        return sorted(results, key=lambda r: r.id), await fabric.stats()

    async def _verify(self, topo: Topology, results: list[FlowResult]) -> None:
        """Each flow that ended well is ``verified`` if its destination holds exactly the bytes
        its source wrote (:func:`~rocev2_emu.fabric.agent.flow_data`, by the flow's id): one
        ``digests`` request per destination."""
        specs = {spec.id: spec for spec in self.flows}
        ids: dict[str, list[int]] = {}
        for r in results:
            if r.status == "ok":
                ids.setdefault(r.dst, []).append(r.id)
        dsts = sorted(ids)
        replies = await gather(
            len(dsts), lambda i: ask_node(topo, dsts[i], {"cmd": "digests", "ids": ids[dsts[i]]})
        )
        held = {
            flow_id: digest
            for dst, reply in zip(dsts, replies, strict=True)
            for flow_id, digest in zip(ids[dst], reply["sha256"], strict=True)
        }
        for r in results:
            if r.status == "ok":
                r.verified = held.get(r.id) == data_digest(flow_data(specs[r.id]))

    async def node_died(self, name: str, code: int) -> bool:
        return False
