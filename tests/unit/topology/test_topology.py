"""Topology files: the shipped examples, the generators, routes, and errors that name the file,
the key and the bad value."""

from __future__ import annotations

import math
import random
import re
import tomllib
from pathlib import Path
from typing import Any

import pytest

from rocev2_emu.runtime.link import LinkFaults, faults_from_request
from rocev2_emu.topology.file import load, parse
from rocev2_emu.topology.generate import ai_zone, fat_tree, leaf_spine, single_switch
from rocev2_emu.topology.model import TopologyError, shortest_path_routes
from rocev2_emu.topology.paths import _toward_switches
from rocev2_emu.topology.routes import RouteTable

EXAMPLES = Path(__file__).resolve().parents[3] / "examples" / "topologies"


def test_shipped_examples_are_the_generators_output() -> None:
    assert (EXAMPLES / "single-switch.toml").read_text() == single_switch(8)
    assert (EXAMPLES / "leaf-spine.toml").read_text() == leaf_spine(2, 4, 2)
    t = load(EXAMPLES / "leaf-spine.toml")
    assert (len(t.switches), len(t.hosts), len(t.links)) == (6, 8, 16)
    assert all(link.rate_bps == 100e9 for link in t.links)
    # from a leaf, hosts of another leaf are reached over both spines (ECMP), own hosts direct
    assert t.routes["leaf0"]["h7"] == (0, 1)
    assert len(t.routes["leaf0"]["h0"]) == 1
    assert t.routes["spine1"]["h7"] == (3,)


def test_fat_tree_k4() -> None:
    t = parse(tomllib.loads(fat_tree(4)))
    assert (len(t.switches), len(t.hosts)) == (20, 16)
    assert len(t.routes["edge0_0"]["h15"]) == 2  # up to either aggregation switch
    assert len(t.routes["agg0_0"]["h15"]) == 2  # up to either of its cores
    assert len(t.routes["core0"]["h15"]) == 1  # down into the pod


def test_routes_with_links_down_and_of_a_pair_of_hosts() -> None:
    """Routes over the links still up, a host cut off routed nowhere; two hosts joined by
    their link (a perftest pair) need no switch and have no routes."""
    t = parse(tomllib.loads(fat_tree(4)))
    up = [link for link in t.links if {link.a, link.b} == {"edge0_0", "agg0_0"}]
    assert len(up) == 1
    routes = shortest_path_routes(t.nodes, t.path, frozenset({up[0].index}))
    assert len(routes["edge0_0"]["h15"]) == 1  # only the other aggregation switch is left
    h0 = [link for link in t.links if "h0" in (link.a, link.b)]
    assert shortest_path_routes(t.nodes, t.path, frozenset({h0[0].index}))["core0"]["h0"] == ()
    pair = {"fabric": {"name": "pair"}, "host": [{"name": "a"}, {"name": "b"}]}
    assert parse({**pair, "link": [{"a": "a", "b": "b"}]}, "pair.toml").routes == {}


def _one_search_per_start(
    graph: dict[str, list[tuple[int, str]]], start: str
) -> dict[str, tuple[int, ...]]:
    """The plain way: a breadth-first search from ``start``, then each switch's ports to a
    neighbour one hop nearer (the reference the all-at-once search must equal)."""
    dist, queue = {start: 0}, [start]
    for cur in queue:
        for _, peer in graph[cur]:
            if peer not in dist:
                dist[peer] = dist[cur] + 1
                queue.append(peer)
    return {
        sw: tuple(i for i, peer in graph[sw] if dist.get(peer) == dist[sw] - 1)
        for sw in graph
        if sw in dist and sw != start
    }


@pytest.mark.parametrize("seed", range(20))
def test_one_search_for_all_starts_finds_each_starts_shortest_paths(seed: int) -> None:
    """Random switch graphs (parallel links, switches cut off, several components): the
    bit-set search gives every start the ports a search of its own gives."""
    rng = random.Random(seed)
    names = [f"s{i}" for i in range(rng.randint(1, 40))]
    graph: dict[str, list[tuple[int, str]]] = {n: [] for n in names}
    for _ in range(rng.randint(0, 3 * len(names))):
        a, b = rng.choice(names), rng.choice(names)
        if a != b:
            graph[a].append((len(graph[a]), b))
            graph[b].append((len(graph[b]), a))
    starts = rng.sample(names, rng.randint(1, len(names)))
    toward = _toward_switches(graph, starts)
    assert toward == {s: _one_search_per_start(graph, s) for s in starts}


def test_addresses_and_switch_config() -> None:
    t = parse(tomllib.loads(single_switch(3)))
    assert [h.ip for h in t.hosts] == ["10.0.0.1", "10.0.0.2", "10.0.0.3"]
    assert t.nodes["sw0"].address == "127.10.0.10" and t.nodes["h0"].address == "127.10.0.11"
    cfg = t.switch_config("sw0")
    assert [p.vni for p in cfg.ports] == [1, 2, 3]
    assert cfg.routes[0x0A000002] == (1,)
    assert cfg.pfc_enabled and cfg.lossless == frozenset({3})


@pytest.mark.parametrize(
    ("patch", "message"),
    [
        ({"fabric": {"tdf": -1}}, r"\[fabric\]\.tdf = -1: must be > 0"),
        ({"fabric": {"mtu": 1500}}, r"\[fabric\]\.mtu = 1500"),
        ({"buffer": {"mode": "deep"}}, r"\[buffer\]\.mode = 'deep': must be one of"),
        ({"fabric": {"ecmp": "random"}}, r"\[fabric\]\.ecmp = 'random': must be one of 5-tuple"),
        ({"fabric": {"tdf": "fast"}}, r"\[fabric\]\.tdf = 'fast': wrong type str"),
        ({"pfc": {"lossless_priorities": [9]}}, r"\[pfc\]\.lossless_priorities = \[9\]"),
        ({"pfc": {"quanta": 70000}}, r"\[pfc\]\.quanta = 70000"),
        ({"buffer": {"colour": 1}}, r"\[buffer\]\.colour = 1: unknown key"),
        ({"routing": {}}, r"routing = '...': unknown section"),
        ({"fabric": {"tdf": math.inf}}, r"\[fabric\]\.tdf = inf: must be a finite number"),
        (
            {"link_defaults": {"rate_gbps": math.nan}},
            r"\[link_defaults\]\.rate_gbps = nan: must be a finite",
        ),
        (
            {"link_defaults": {"delay_us": math.inf}},
            r"\[link_defaults\]\.delay_us = inf: must be a finite",
        ),
        ({"dcqcn": {"g": math.nan}}, r"\[dcqcn\]\.g = nan: must be a finite number"),
        (
            {"pfc": {"watchdog_detect_ms": math.inf}},
            r"\[pfc\]\.watchdog_detect_ms = inf: must be a finite",
        ),
        ({"buffer": {"size_bytes": 1000}}, r"\[buffer\]\.size_bytes = 1000: too small: sw0's"),
    ],
)
def test_errors_name_file_key_and_value(patch: dict[str, dict[str, object]], message: str) -> None:
    data = tomllib.loads(single_switch(2))
    for section, values in patch.items():
        data.setdefault(section, {}).update(values)
    with pytest.raises(TopologyError, match=r"^net\.toml: " + message):
        parse(data, "net.toml")


@pytest.mark.parametrize(
    ("key", "value"), [("loss", True), ("rate_gbps", True), ("delay_us", False)]
)
def test_a_links_boolean_is_no_number(key: str, value: bool) -> None:
    """``[[link]] loss = true`` ran with loss 1.0, ``rate_gbps = true`` at 1 Gbit/s."""
    data = tomllib.loads(single_switch(2))
    data["link"][0][key] = value
    with pytest.raises(TopologyError, match=rf"\[\[link\]\] #1 {key} = {value}"):
        parse(data, "x.toml")


def test_link_and_node_errors(tmp_path: Path) -> None:
    data = tomllib.loads(single_switch(2))
    data["link"][0]["b"] = "sw9"
    with pytest.raises(TopologyError, match=r"\[\[link\]\] #1 b = 'sw9': no such node"):
        parse(data, "x.toml")
    data = tomllib.loads(single_switch(2))
    data["host"].append({"name": "h0"})
    with pytest.raises(TopologyError, match=r"h0.*duplicate"):
        parse(data, "x.toml")
    data = tomllib.loads(single_switch(2))
    data["link"].append({"a": "h0", "b": "sw0"})
    with pytest.raises(TopologyError, match="exactly one link"):
        parse(data, "x.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[fabric\nname=")
    with pytest.raises(TopologyError, match=r"bad\.toml: not valid TOML"):
        load(bad)
    with pytest.raises(TopologyError, match="cannot read"):
        load(tmp_path / "missing.toml")


@pytest.mark.parametrize(
    "faults",
    [
        {"delay": math.inf},
        {"jitter": math.inf},
        {"loss": math.nan},
        {"corrupt": -0.1},
    ],
)
def test_link_faults_refuse_what_no_link_can_do(faults: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="must be a finite number >= 0"):
        LinkFaults(**faults)


@pytest.mark.parametrize(
    "faults",
    [{"loss": True}, {"delay": False}, [("loss", 0.1)], {"loss": "x"}, {"seed": 1.5}, {"lost": 1}],
)
def test_a_set_faults_request_with_a_boolean_or_no_map_is_refused(faults: Any) -> None:
    """A boolean is no probability (``loss=True`` was taken as 1.0 through set_faults); a
    string is named as the field's in both builds (the compiled one's own TypeError named none)."""
    with pytest.raises(ValueError, match=r"not a boolean|must be a map|must be a number|no such"):
        faults_from_request(faults)
    assert faults_from_request({"loss": 0.1, "seed": 3}) == LinkFaults(loss=0.1, seed=3)


def test_the_ai_zone_generator_keeps_its_ratios_and_deep_buffer_spines() -> None:
    text = ai_zone(2, 3, 2, 4, 4, 2, host_gbps=400, ctsw_buffer_mb=64)
    topo = parse(tomllib.loads(text), "ai.toml")
    assert len(topo.hosts) == 2 * 3 * 2 * 4  # zones x racks x servers x accelerators
    kinds = [n.name.rstrip("0123456789_") for n in topo.switches]
    assert (kinds.count("atsw"), kinds.count("ctsw"), kinds.count("rtsw")) == (2, 8, 6)
    gbps = {(lk.a, lk.b): lk.rate_bps / 1e9 for lk in topo.links}
    for z in range(2):
        for r in range(3):
            rtsw = f"rtsw{z}_{r}"
            down = sum(v for (a, b), v in gbps.items() if b == rtsw and a.startswith("h"))
            up = sum(v for (a, b), v in gbps.items() if a == rtsw)
            assert down == 8 * 400 and up == pytest.approx(1.125 * down)  # 12.5 % spare
            assert {b for (a, b) in gbps if a == rtsw} == {f"ctsw{z}_{c}" for c in range(4)}
    for c in range(4):  # a CTSW: its downlinks over the oversubscription go across zones
        ctsw = f"ctsw0_{c}"
        down = sum(v for (a, b), v in gbps.items() if b == ctsw)
        cross = sum(v for (a, b), v in gbps.items() if a == ctsw)
        assert cross == pytest.approx(down / 7)
        mmu = topo.switch_config(ctsw).mmu
        assert (mmu.buffer_bytes, mmu.mode) == (64 << 20, "static")  # deep, statically divided
    assert topo.switch_config("rtsw0_0").mmu == topo.mmu  # the fabric's buffer
    single = parse(tomllib.loads(ai_zone(zones=1)), "one.toml")  # one zone: no aggregation
    assert not any(n.name.startswith("atsw") for n in single.switches)
    with pytest.raises(ValueError, match="at least one rack"):
        ai_zone(racks=0)


def test_the_seeds_cluster_is_written_as_a_file() -> None:
    """Meta's 24 576-accelerator RoCE cluster: 8 zones of 192 racks of two 8-GPU servers."""
    text = ai_zone(8, 192, 2, 8, 18, 18, ctsw_buffer_mb=16384)
    assert text.count("[[host]]") == 24576
    assert text.count("[[switch]]") == 8 * 192 + 8 * 18 + 18
    assert text.count("[[link]]") == 24576 + 8 * 192 * 18 + 8 * 18 * 18


@pytest.mark.parametrize(
    ("switch", "message"),
    [
        ({"buffer_bytes": -1}, "buffer_bytes = -1: must be an integer >= 0"),
        ({"buffer_bytes": True}, "buffer_bytes = True: must be an integer >= 0"),
        ({"buffer_mode": "deep"}, "buffer_mode = 'deep': one of"),
        ({"buffer_bytes": 4096}, "too small: sw0's 2 ports need"),
    ],
)
def test_a_switchs_own_buffer_is_checked(switch: dict[str, Any], message: str) -> None:
    data = tomllib.loads(single_switch(2))
    data["switch"][0].update(switch)
    with pytest.raises(TopologyError, match=re.escape(message)):
        parse(data, "t.toml")


def test_rails_wire_accelerator_i_of_every_server_to_rail_leaf_i() -> None:
    text = ai_zone(1, 2, 2, 4, 2, rails=True)  # 1 zone, 2 racks of 2 servers of 4 accelerators
    topo = parse(tomllib.loads(text), "rails.toml")
    assert len(topo.hosts) == 16
    rails = sorted(n.name for n in topo.switches if n.name.startswith("rail"))
    assert rails == ["rail0_0", "rail0_1", "rail0_2", "rail0_3"]
    for h, host in enumerate(topo.hosts):  # host h is accelerator h % 4 of server h // 4
        _, leaf = topo.host_link(host.name)
        assert leaf.name == f"rail0_{h % 4}"
    gbps = {(lk.a, lk.b): lk.rate_bps / 1e9 for lk in topo.links}
    up = sum(v for (a, b), v in gbps.items() if a == "rail0_0")
    assert up == pytest.approx(1.125 * 4 * 400)  # its four servers' accelerator 0, 12.5 % spare


def test_generators_write_servers_of_several_accelerators() -> None:
    from rocev2_emu.topology.generate import Servers

    for text in (
        single_switch(2, servers=Servers(4, "pcie")),
        leaf_spine(2, 2, 1, servers=Servers(4, "pcie")),
        fat_tree(2, servers=Servers(4, "pcie")),
    ):
        topo = parse(tomllib.loads(text))
        assert all(h.ranks == 4 for h in topo.hosts)
        assert topo.server.kind == "pcie" and topo.server.bandwidth_bps == 504e9
        assert "--ranks-per-host 4 --server-fabric pcie" in text.splitlines()[0]
    plain = parse(tomllib.loads(single_switch(2)))
    assert plain.server.kind == "nvlink"  # the default, with no [server] written
    assert "[server]" not in single_switch(2)
    with pytest.raises(ValueError, match="--server-fabric 'nvswitch'"):
        Servers(2, "nvswitch")
    with pytest.raises(ValueError, match="--ranks-per-host 0"):
        Servers(0)


@pytest.mark.parametrize(
    "text",
    [
        lambda: single_switch(130),
        lambda: leaf_spine(2, 2, 200),
        lambda: ai_zone(2, 128, 2, 8, ctsws=8, atsws=4),  # a CTSW of 132 ports, no deep buffer
        lambda: ai_zone(1, 64, 1, 8, ctsws=2, rails=True),  # a rail of 64 servers
    ],
)
def test_every_generated_shape_is_a_file_its_parser_takes(text: Any) -> None:
    """``topology ai-zone --zones 2 --racks 128 --servers-per-rack 2 --accelerators 8 --ctsws 8
    --atsws 4`` wrote a buffer too small for its CTSWs, which bench refused (issue 55)."""
    topo = parse(tomllib.loads(text()), "generated.toml")
    assert topo.switches


@pytest.mark.parametrize("seed", range(20))
def test_a_table_from_runs_of_hosts_is_the_table_of_the_mapping_they_spell(seed: int) -> None:
    """shortest_path_routes hands each switch runs of hosts sharing ports (not a dict entry
    per host); the table must be :meth:`RouteTable.of`'s of the same mapping - the same
    default on a tie (the first of the commonest), the same exceptions in the same order."""
    rng = random.Random(seed)
    keys = tuple(f"h{i}" for i in range(rng.randrange(0, 40)))
    choices = [(), (1,), (2, 3), (0, 1, 2)]
    runs: list[tuple[list[str], tuple[int, ...]]] = []
    at = 0
    while at < len(keys):
        n = rng.randrange(1, 6)
        runs.append((list(keys[at : at + n]), rng.choice(choices)))
        at += n
    full = {k: ports for names, ports in runs for k in names}
    want, got = (
        RouteTable.of(full, keys, frozenset(keys)),
        RouteTable.of_runs(runs, keys, frozenset(keys)),
    )
    assert (got.default, list(got.other.items())) == (want.default, list(want.other.items()))
    assert dict(got) == full


def test_a_switchs_routes_hold_its_commonest_ports_once_and_read_as_the_full_table() -> None:
    topo = parse(tomllib.loads(ai_zone(2, 4, 2, 2)), "zone.toml")  # 32 hosts, 2 zones
    hosts = [h.name for h in topo.hosts]
    leaf = topo.routes["rtsw0_0"]  # a rack switch: its 4 hosts, else its uplinks
    assert len(leaf.other) == 4 and len(leaf) == len(hosts) and list(leaf) == hosts
    assert all(len(leaf[h]) == 2 for h in hosts[4:])  # up to either CTSW
    with pytest.raises(KeyError):
        leaf["sw-nowhere"]
    by_ip = topo.routes_by_ip("rtsw0_0")
    config = topo.switch_config("rtsw0_0")
    assert {ip: config.routes.get(ip, config.default_route) for ip in by_ip} == by_ip
    assert config.hosts == frozenset(by_ip) and len(config.routes) == 4
