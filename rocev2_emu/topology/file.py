"""One TOML topology file drives everything: hosts, switches, links, buffer, PFC, ECN, DCQCN, TDF.

Parsed with the standard library's ``tomllib``; every error names the file, the key and the bad
value.  :func:`load` returns a :class:`Topology` with addresses assigned and shortest-path ECMP
routes computed (:mod:`rocev2_emu.topology.model`), from which the switch pipeline's and the NICs'
configurations are built; the global sections' defaults and checks are
:mod:`rocev2_emu.topology.sections`.  Layout of the file::

    [fabric]        name, tdf, seed, mtu, subnet (nodes at its address 10 + i; default 127.10.x.y),
                    payload ("real", default; "none": timing-only, frames carry their headers),
                    batch_io (UDP GSO/GRO between node processes; default true),
                    ecmp ("5-tuple", default; "5-tuple+qpn": Meta's E-ECMP, the BTH destination
                    QP hashed too; "destination": path pinning, one path per destination host)
    [link_defaults] rate_gbps, delay_us, loss
    [buffer]        size_bytes, reserve_bytes, headroom_bytes, alpha, xoff_bytes, xon_offset_bytes,
                    mode ("shared", default; "static": a fixed partition per ingress port)
    [pfc]           enabled, lossless_priorities, quanta, watchdog_detect_ms,
                    watchdog_restore_ms, watchdog_action
    [ecn]           enabled, priorities, kmin_kb, kmax_kb, pmax (default: scaled to link rate)
    [dcqcn]         enabled, profile ("paper", "nvidia", "hpcc"), and any DcqcnParams field to
                    override (g, rate_ai, cnp_interval, ...)
    [transport]     qp_timeout (4.096 us x 2^N; default 12, 16.8 ms), retry_cnt, max_inflight,
                    pacing_gbps (every QP paced at this rate when DCQCN is off; 0: off)
                    (unacknowledged packets per QP; default 4096: paced NICs need no window)
    [server]        fabric ("nvlink", default; "pcie"; "free": copies take no time), and
                    optionally bandwidth_gbps (per accelerator, each way) and latency_us: what
                    joins the ranks of one server (rocev2_emu.server.crossbar names the presets'
                    sources)
    [[switch]]      name, and optionally buffer_bytes and buffer_mode: its own buffer (a
                    deep-buffer spine, say) instead of the fabric's [buffer] size and mode
    [[host]]        name, ranks, rx_gbps (a slow receiver: its NIC pauses the switch), server
                    (hosts naming one server are its accelerators, a NIC and one rank each,
                    joined by [server]'s fabric; default: the host is a server of its own,
                    its ranks sharing its NIC)
    [[link]]        a, b, and optionally rate_gbps, delay_us, loss
"""

from __future__ import annotations

import ipaddress
import math
import socket
import time
import tomllib
from functools import partial
from pathlib import Path
from typing import Any

from rocev2_emu.server.crossbar import PRESETS as SERVER_FABRICS
from rocev2_emu.server.crossbar import IntraServerConfig
from rocev2_emu.topology.model import (
    Link,
    Node,
    NodeKind,
    Topology,
    TopologyError,
    shortest_path_routes,
)
from rocev2_emu.topology.sections import bad_value, sections
from switch.mmu import BUFFER_MODES, MmuConfig, pfc_headroom


def resolve_names(topo: Topology, timeout: float = 120.0) -> Topology:
    """With ``subnet = "dns"`` (docker swarm), replace every node's name by the address it
    resolves to, waiting for names that do not resolve yet (their tasks are still starting).
    Everything downstream then works with addresses, as in the other modes."""
    if topo.subnet != "dns":
        return topo
    deadline = time.monotonic() + timeout
    for node in topo.nodes.values():
        while True:
            try:
                node.address = socket.gethostbyname(node.name)
                break
            except OSError as exc:
                if time.monotonic() > deadline:
                    raise TopologyError(
                        f"{topo.path}: node {node.name!r} did not resolve within {timeout:g} s"
                    ) from exc
                time.sleep(0.5)
    topo.subnet = "resolved"
    topo._shared = None  # the addresses changed (Topology.shares_address finds them again)
    return topo


def load(path: str | Path) -> Topology:
    path = str(path)
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except OSError as exc:
        raise TopologyError(f"{path}: cannot read: {exc.strerror}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise TopologyError(f"{path}: not valid TOML: {exc}") from exc
    return parse(data, path)


def _nodes(
    data: dict[str, Any], fab: dict[str, Any], path: str
) -> tuple[dict[str, Node], list[Node]]:
    """The ``[[switch]]`` and ``[[host]]`` tables: every node with its address; and the hosts."""
    fail = partial(bad_value, path)
    subnet = None
    if fab["subnet"] and fab["subnet"] != "dns":  # containers: node i at address 10 + i
        try:
            subnet = ipaddress.IPv4Network(fab["subnet"])
        except ValueError as exc:
            raise fail("[fabric].subnet", fab["subnet"], f"not an IPv4 network: {exc}") from exc
    nodes: dict[str, Node] = {}
    for kind in (NodeKind.SWITCH, NodeKind.HOST):
        items = data.get(kind, [])
        if not isinstance(items, list):
            raise fail(f"[[{kind}]]", items, "must be an array of tables")
        for i, item in enumerate(items):
            name = item.get("name") if isinstance(item, dict) else None
            if not isinstance(name, str) or not name:
                raise fail(f"[[{kind}]] #{i + 1} name", name, "every node needs a name")
            if name in nodes:
                raise fail(f"[[{kind}]] #{i + 1} name", name, "duplicate node name")
            extra = set(item) - {"name", "ranks", "rx_gbps"}
            if kind is NodeKind.SWITCH:
                extra -= {"buffer_bytes", "buffer_mode"}
            else:
                extra -= {"server"}
            if extra:
                raise fail(f"[[{kind}]] {name}", sorted(extra), "unknown keys")
            index = len(nodes)
            address = f"127.10.{index // 200}.{index % 200 + 10}"
            if subnet is not None:
                if index + 10 >= subnet.num_addresses - 1:
                    raise fail("[fabric].subnet", fab["subnet"], "too small for every node")
                address = str(subnet.network_address + 10 + index)
            if fab["subnet"] == "dns":  # docker swarm: a node is found by its name
                address = name
            ranks = item.get("ranks", 1 if kind is NodeKind.HOST else 0)
            if kind is NodeKind.HOST and (
                not isinstance(ranks, int) or isinstance(ranks, bool) or ranks < 0
            ):
                raise fail(f"[[host]] {name}.ranks", ranks, "must be an integer >= 0")
            rx = item.get("rx_gbps", 0.0)
            if not isinstance(rx, int | float) or isinstance(rx, bool) or rx < 0:
                raise fail(f"[[{kind}]] {name}.rx_gbps", rx, "must be a number >= 0")
            own = item.get("buffer_bytes", 0)  # a switch's own buffer (hosts have no such key)
            if not isinstance(own, int) or isinstance(own, bool) or own < 0:
                raise fail(f"[[switch]] {name}.buffer_bytes", own, "must be an integer >= 0")
            mode = item.get("buffer_mode", "")
            if mode and mode not in BUFFER_MODES:
                raise fail(f"[[switch]] {name}.buffer_mode", mode, f"one of {list(BUFFER_MODES)}")
            server = item.get("server", "")
            if not isinstance(server, str):
                raise fail(f"[[host]] {name}.server", server, "must be a server's name")
            if server and ranks != 1:
                raise fail(
                    f"[[host]] {name}.ranks",
                    ranks,
                    "a host in a server is one accelerator's NIC: 1",
                )
            nodes[name] = Node(
                name,
                kind,
                index,
                address,
                ranks,
                float(rx),
                buffer_bytes=own,
                buffer_mode=mode,
                server=server,
            )
    hosts = [n for n in nodes.values() if n.kind is NodeKind.HOST]
    for n in hosts:
        if n.server and n.server in nodes and n.server != n.name:
            raise fail(f"[[host]] {n.name}.server", n.server, "names another node, not a server")
    if not hosts:
        raise fail("[[host]]", [], "a fabric needs at least one host")
    for h, node in enumerate(hosts):
        node.ip = f"10.0.{h // 250}.{h % 250 + 1}"
    return nodes, hosts


def _links(
    data: dict[str, Any], ld: dict[str, Any], nodes: dict[str, Node], path: str
) -> list[Link]:
    """The ``[[link]]`` tables, each link on its two nodes' ports."""
    fail = partial(bad_value, path)
    links: list[Link] = []
    for i, item in enumerate(data.get("link", [])):
        where = f"[[link]] #{i + 1}"
        if not isinstance(item, dict):
            raise fail(where, item, "must be a table")
        for end in ("a", "b"):
            if item.get(end) not in nodes:
                raise fail(f"{where} {end}", item.get(end), "no such node")
        extra = set(item) - {"a", "b", "rate_gbps", "delay_us", "loss"}
        if extra:
            raise fail(where, sorted(extra), "unknown keys")
        if item["a"] == item["b"]:
            raise fail(f"{where} b", item["b"], "a link needs two different nodes")
        rate = item.get("rate_gbps", ld["rate_gbps"])
        delay = item.get("delay_us", ld["delay_us"])
        loss = item.get("loss", ld["loss"])
        if not _is_number(rate) or not 0 <= rate < math.inf:
            raise fail(f"{where} rate_gbps", rate, "must be a finite number >= 0")
        if not _is_number(delay) or not 0 <= delay < math.inf:
            raise fail(f"{where} delay_us", delay, "must be a finite number >= 0")
        if not _is_number(loss) or not 0 <= loss <= 1:
            raise fail(f"{where} loss", loss, "must be a probability")
        link = Link(len(links), item["a"], item["b"], rate * 1e9, delay * 1e-6, float(loss))
        links.append(link)
        nodes[link.a].ports.append((link, link.b))
        nodes[link.b].ports.append((link, link.a))
    return links


def _is_number(value: Any) -> bool:
    """An int or a float, not a boolean (TOML's ``true`` is no rate, delay or probability)."""
    return isinstance(value, int | float) and not isinstance(value, bool)


def parse(data: dict[str, Any], path: str = "<topology>") -> Topology:
    """A topology from a parsed TOML document; every error names ``path``, key and value."""
    sec = sections(data, path)
    fab, pfc, ecn = sec["fabric"], sec["pfc"], sec["ecn"]
    nodes, hosts = _nodes(data, fab, path)
    links = _links(data, sec["link_defaults"], nodes, path)
    for node in hosts:
        if len(node.ports) != 1:
            raise bad_value(
                path, f"[[host]] {node.name}", len(node.ports), "a host needs exactly one link"
            )

    buf = sec["buffer"]
    lossless = bool(pfc["enabled"])  # without PFC no port holds headroom for its link
    for sw in (n for n in nodes.values() if n.kind is NodeKind.SWITCH):
        needed = sum(
            max(
                buf["headroom_bytes"],
                pfc_headroom(link.rate_bps, link.delay, fab["mtu"]) if lossless else 0,
            )
            + 8 * buf["reserve_bytes"]
            for link, _ in sw.ports
        )
        size = sw.buffer_bytes or buf["size_bytes"]
        if size <= needed:
            key = f"[[switch]] {sw.name}.buffer_bytes" if sw.buffer_bytes else "[buffer].size_bytes"
            raise bad_value(
                path,
                key,
                size,
                f"too small: {sw.name}'s {len(sw.ports)} ports need {needed} bytes of "
                "headroom (each as its link's rate and delay need it) and per-priority reserve, "
                "and a shared pool beyond that",
            )
    mmu = MmuConfig(
        sec["buffer"]["size_bytes"],
        sec["buffer"]["reserve_bytes"],
        sec["buffer"]["headroom_bytes"],
        float(sec["buffer"]["alpha"]),
        sec["buffer"]["xoff_bytes"],
        sec["buffer"]["xon_offset_bytes"],
        sec["buffer"]["mode"],
    )
    routes = shortest_path_routes(nodes, path)
    srv = sec["server"]
    preset = SERVER_FABRICS[srv["fabric"]]
    server = IntraServerConfig(
        preset.kind,
        preset.bandwidth_bps if srv["bandwidth_gbps"] is None else srv["bandwidth_gbps"] * 1e9,
        preset.latency if srv["latency_us"] is None else srv["latency_us"] * 1e-6,
    )
    return Topology(
        path,
        fab["name"],
        float(fab["tdf"]),
        fab["seed"],
        fab["mtu"],
        nodes,
        links,
        mmu,
        pfc,
        ecn,
        sec["dcqcn"],
        sec["transport"],
        routes,
        fab["subnet"],
        fab["batch_io"],
        fab["ecmp"],
        server,
        servers_of(nodes),
        fab["payload"],
    )


def servers_of(nodes: dict[str, Node]) -> dict[str, list[str]]:
    """Every server's hosts in file order (a host without ``server`` is a server of its own)."""
    servers: dict[str, list[str]] = {}
    for n in nodes.values():
        if n.kind is NodeKind.HOST:
            servers.setdefault(n.server or n.name, []).append(n.name)
    return servers
