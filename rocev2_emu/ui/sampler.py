"""What the live map shows, sampled from a running fabric: the layout of its nodes in tiers, and
every half second each link's load per direction, the ports under PFC pause, queue depths and
the counters.

The layout (:func:`layout`) puts hosts in the bottom tier and each switch one tier above the
lowest of its neighbours (leaves, then spines, then a fat-tree's cores), nodes in topology order
within a tier; with three tiers of switches, what stays connected below the top tier is a pod
(:func:`pods`: a fat-tree's edge and aggregation switches and their hosts), drawn in its own
band of the width.  A sample (:class:`Sampler`) asks every switch for its ports (the ``ports``
control command: bytes sent, queue depth, XOFF in force, pause frames, ECN marks, drops) and
every host for its NIC's counters, its QPs' DCQCN rates and its server's fabric (``map``), and
turns byte counters into rates over the emulated time between two samples: every figure is in
emulated units.  A server of several accelerators (its ranks on one host, or a host per
accelerator's NIC) is drawn as a box around its hosts, coloured by its fabric's busiest port.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import trio

from rocev2_emu.fabric.control import control
from rocev2_emu.topology.model import NodeKind, Topology
from rocev2_emu.verbs import VerbsError

Ask = Callable[[str, dict[str, Any]], Awaitable[Any]]
HOST_COUNTERS = ("retransmitted", "cnps_sent", "cnps_handled", "nic_pauses", "timeouts")


def layout(topo: Topology) -> dict[str, Any]:
    """Nodes with their tier and position, links with their ends and rate: the page draws it."""
    tier = {h.name: 0 for h in topo.hosts}
    pending = [sw.name for sw in topo.switches]
    while pending:
        rest = []
        for name in pending:
            below = [tier[p] for _, p in topo.nodes[name].ports if p in tier]
            if below:
                tier[name] = min(below) + 1
            else:
                rest.append(name)
        if len(rest) == len(pending):  # switches with no way down: put them on top
            top = max(tier.values(), default=0) + 1
            tier.update({name: top for name in rest})
            break
        pending = rest
    top = max(tier.values(), default=0)
    pod = pods(topo, {n for n, t in tier.items() if t == top}) if top >= 3 else {}
    count = max(pod.values(), default=-1) + 1
    rows: dict[tuple[int, int], list[str]] = {}  # (tier, pod) -> names, in topology order
    for name in topo.nodes:
        rows.setdefault((tier[name], pod.get(name, -1)), []).append(name)
    nodes = []
    for (t, p), names in sorted(rows.items()):
        # a pod's nodes share its band of the width (a small gap between bands); the rest span it
        x0, width = (0.0, 1.0) if p < 0 else ((p + 0.04) / count, 0.92 / count)
        for i, name in enumerate(names):
            x = x0 + width * (i + 0.5) / len(names)
            nodes.append({"name": name, "kind": topo.nodes[name].kind, "tier": t, "x": x})
            if p >= 0:
                nodes[-1]["pod"] = p
    bands = [{"pod": p, "x0": (p + 0.02) / count, "x1": (p + 0.98) / count} for p in range(count)]
    links = [{"a": lk.a, "b": lk.b, "vni": lk.vni, "rate_bps": lk.rate_bps} for lk in topo.links]
    servers = [  # a server's accelerators and what joins them (its hosts side by side)
        {"name": name, "hosts": hosts, "fabric": topo.server.describe()}
        for name, hosts in topo.servers.items()
        if sum(topo.nodes[h].ranks for h in hosts) > 1 and not topo.server.free
    ]
    return {
        "name": topo.name,
        "tdf": topo.tdf,
        "tiers": top + 1,
        "nodes": nodes,
        "links": links,
        "pods": bands,
        "servers": servers,
    }


def pods(topo: Topology, top: set[str]) -> dict[str, int]:
    """A fat-tree's pods: what stays connected once the top tier (the cores) is taken away,
    numbered in topology order; {} when that leaves one piece (no pods to draw)."""
    pod: dict[str, int] = {}
    for start in topo.nodes:
        if start in top or start in pod:
            continue
        number = len(set(pod.values()))
        stack = [start]
        while stack:
            name = stack.pop()
            if name in pod or name in top:
                continue
            pod[name] = number
            stack.extend(peer for _, peer in topo.nodes[name].ports if peer not in pod)
    return pod if len(set(pod.values())) > 1 else {}


class Sampler:
    """Samples of a running fabric: :meth:`sample` returns one, rates since the previous."""

    def __init__(self, topo: Topology, ask: Ask = control) -> None:
        self.topo = topo
        self.ask = ask
        self._last: dict[str, Any] | None = None
        # for each link, which port of which switch sends each way (None: a host's NIC)
        self._ends: list[tuple[tuple[str, int] | None, tuple[str, int] | None]] = []
        for lk in topo.links:
            ends: list[tuple[str, int] | None] = []
            for end in (lk.a, lk.b):
                node = topo.nodes[end]
                if node.kind is NodeKind.SWITCH:
                    ends.append((end, topo.port_of(end, lk)))
                else:
                    ends.append(None)
            self._ends.append((ends[0], ends[1]))

    async def _read(self, spread: float) -> tuple[dict[str, Any], dict[str, Any]]:
        switches: dict[str, Any] = {}
        hosts: dict[str, Any] = {}

        async def one(name: str, kind: str, delay: float) -> None:
            addr = self.topo.nodes[name].address
            await trio.sleep(delay)
            with trio.move_on_after(5):
                try:
                    if kind is NodeKind.SWITCH:
                        switches[name] = await self.ask(addr, {"cmd": "ports"})
                    else:
                        hosts[name] = await self.ask(addr, {"cmd": "map"})
                except (OSError, RuntimeError, VerbsError):  # a node gone: shown as missing
                    pass

        nodes = list(self.topo.nodes.values())
        async with trio.open_nursery() as nursery:
            for i, node in enumerate(nodes):
                nursery.start_soon(one, node.name, node.kind, spread * i / len(nodes))
        return switches, hosts

    async def sample(self, spread: float = 0.0) -> dict[str, Any]:
        """One sample, the nodes asked one after another over ``spread`` wall seconds (not all
        at once: on a machine at its limit, fourteen nodes interrupted together fall behind
        together); each link's rate is over its sending node's own emulated time."""
        return self.compose(*await self._read(spread))

    def compose(self, switches: dict[str, Any], hosts: dict[str, Any]) -> dict[str, Any]:
        """The sample of these answers (``ports`` by switch, ``map`` by host), rates since the
        previous one: what :meth:`sample` returns, for answers read without asking."""
        now = max((s.get("now", 0.0) for s in [*switches.values(), *hosts.values()]), default=0.0)
        last = self._last
        links: list[dict[str, Any]] = []
        for lk, (ea, eb) in zip(self.topo.links, self._ends, strict=True):
            row: dict[str, Any] = {"a": lk.a, "b": lk.b}
            for key, sender, sending_node in (("ab", ea, lk.a), ("ba", eb, lk.b)):
                tx = self._tx(sender, sending_node, switches, hosts)
                reply = switches.get(sender[0], {}) if sender else hosts.get(sending_node, {})
                t = float(reply.get("now", now))  # when the sender counted its bytes
                port = self._port(sender, switches)
                before = last["links"][len(links)] if last else {}
                prev, dt = before.get(f"{key}_tx"), t - before.get(f"{key}_t", t)
                rate = (
                    (tx - prev) * 8 / dt
                    if (prev is not None and tx is not None and dt > 0)
                    else 0.0
                )
                row[f"{key}_tx"] = tx
                row[f"{key}_t"] = t
                row[f"{key}_bps"] = max(rate, 0.0)
                row[f"{key}_util"] = min(rate / lk.rate_bps, 1.0) if lk.rate_bps else 0.0
                if port is not None:
                    row[f"{key}_paused"] = bool(port["paused"])
                else:  # a host's NIC: the switch's XOFF holding its egress
                    row[f"{key}_paused"] = bool(hosts.get(sending_node, {}).get("nic_paused"))
                row[f"{key}_queue"] = port["queue_bytes"] if port else 0
                row[f"{key}_up"] = port["up"] if port else True
            links.append(row)
        totals = {
            "pfc_tx": sum(p["pfc_tx"] for s in switches.values() for p in s.get("ports", [])),
            "ecn_marked": sum(
                p["ecn_marked"] for s in switches.values() for p in s.get("ports", [])
            ),
            "drops": sum(p["drops"] for s in switches.values() for p in s.get("ports", [])),
            **{k: sum(int(h.get(k, 0)) for h in hosts.values()) for k in HOST_COUNTERS},
        }
        nodes = {
            name: {k: int(h.get(k, 0)) for k in HOST_COUNTERS} | {"qp_rates": h.get("qp_rates", {})}
            for name, h in hosts.items()
        } | {
            name: {
                "pfc_tx": sum(p["pfc_tx"] for p in s["ports"]),
                "ecn_marked": sum(p["ecn_marked"] for p in s["ports"]),
                "drops": sum(p["drops"] for p in s["ports"]),
                "paused_ports": sum(1 for p in s["ports"] if p["paused"]),
            }
            for name, s in switches.items()
        }
        missing = sorted(set(self.topo.nodes) - set(switches) - set(hosts))
        ranks = {  # every rank's progress in its collectives, and the one furthest behind
            int(r): {"host": name, **row}
            for name, h in hosts.items()
            for r, row in h.get("ranks", {}).items()
        }

        def done(r: int) -> tuple[float, float]:  # finished ops, then bytes with the one going
            row = ranks[r]
            return row["ops"], row["bytes"] + row.get("op_received", 0.0)

        slowest = min(ranks, key=done, default=None)
        if slowest is not None and all(done(r) == done(slowest) for r in ranks):
            slowest = None  # all level: nobody is behind
        out = {
            "t": now,
            "links": links,
            "totals": totals,
            "nodes": nodes,
            "missing": missing,
            "ranks": ranks,
            "slowest": slowest,
            "servers": self._servers(hosts, now, last),
        }
        self._last = out
        return out

    @staticmethod
    def _servers(
        hosts: dict[str, Any], now: float, last: dict[str, Any] | None
    ) -> dict[str, dict[str, Any]]:
        """Each server's fabric since the previous sample: bytes sent into it per emulated
        second (``bps``) and its busiest accelerator port's share of the time busy (``util``,
        sending or receiving), with the counters they come from."""
        before = last.get("servers", {}) if last else {}
        out: dict[str, dict[str, Any]] = {}
        for h in hosts.values():
            for name, fab in h.get("server_fabric", {}).items():
                tx = sum(fab.get("tx_bytes", []))
                busy = [*fab.get("tx_busy", []), *fab.get("rx_busy", [])]
                row: dict[str, Any] = {"t": now, "tx_bytes": tx, "busy": busy, "bps": 0.0}
                row["util"] = 0.0
                prev = before.get(name)
                dt = now - prev["t"] if prev else 0.0
                if prev and dt > 0 and len(prev["busy"]) == len(busy):
                    row["bps"] = max(tx - prev["tx_bytes"], 0.0) * 8 / dt
                    gained = (b - a for a, b in zip(prev["busy"], busy, strict=True))
                    row["util"] = min(max(gained, default=0.0) / dt, 1.0)
                out[name] = row
        return out

    @staticmethod
    def _port(sender: tuple[str, int] | None, switches: dict[str, Any]) -> dict[str, Any] | None:
        """A switch port's state as its switch answered (None: a host's end, or a switch that
        did not answer this time - shown as missing, never a failed sample)."""
        if sender is None:
            return None
        ports = switches.get(sender[0], {}).get("ports") or []
        return ports[sender[1]] if sender[1] < len(ports) else None

    @staticmethod
    def _tx(
        sender: tuple[str, int] | None,
        host: str,
        switches: dict[str, Any],
        hosts: dict[str, Any],
    ) -> int | None:
        """Bytes sent so far into the link from this end: a switch port's or a host NIC's."""
        if sender is not None:
            ports = switches.get(sender[0], {}).get("ports")
            return int(ports[sender[1]]["tx_bytes"]) if ports else None
        h = hosts.get(host)
        return int(h["nic_tx_bytes"]) if h and "nic_tx_bytes" in h else None
