"""Timing-only runs (``--payload none``, ``[fabric] payload = "none"``): frames carry their
headers only, and every emulated figure - each time, mark, pause, retransmission, drop and
byte count - is the run's with real payloads, byte for byte: on the leaf-spine, a k = 4
fat-tree and an AI zone of NVLink servers, under loss."""

from __future__ import annotations

import json
import tomllib
from dataclasses import asdict
from typing import Any

import pytest

from collectives.bench.nccl import params as bench_params
from collectives.jobs.job import run_virtual
from rocev2_emu.fabric.agent import FlowSpec
from rocev2_emu.fabric.virtual import run_flows_virtual
from rocev2_emu.topology.file import parse
from rocev2_emu.topology.generate import ai_zone, fat_tree, leaf_spine
from rocev2_emu.topology.model import Topology
from rocev2_emu.wire.decode import decode_frame_at
from rocev2_emu.wire.errors import MalformedFrame
from rocev2_emu.wire.ethernet import VXLAN_LEN
from rocev2_emu.wire.roce import FrameTemplate, RoceFrame, pack_reth


def _topology(text: str, payload: str, loss: float) -> Topology:
    data = tomllib.loads(text)
    data["fabric"]["payload"] = payload
    for link in data["link"][::3]:  # every third link drops frames: retransmissions, timeouts
        link["loss"] = loss
    return parse(data, "timing.toml")


def _flows(payload: str) -> tuple[Any, Any]:
    topo = _topology(fat_tree(4), payload, 0.003)
    hosts = [h.name for h in topo.hosts]
    flows = [FlowSpec(i, src, hosts[-1], 256 << 10) for i, src in enumerate(hosts[:-1])]
    flows += [FlowSpec(len(flows), hosts[0], hosts[5], 1 << 20, 20e-6)]
    results, fabric = run_flows_virtual(topo, flows)
    rows = []
    for r in results:
        row = asdict(r)
        assert row.pop("verified") is (None if payload == "none" else True), r
        rows.append(row)
    return rows, fabric


def _bench(text: str, payload: str, loss: float, algo: str) -> tuple[Any, Any]:
    topo = _topology(text, payload, loss)
    p = bench_params([4 << 10, 256 << 10], algo=algo, iters=2, warmup=1)
    results, fabric = run_virtual(topo, "bench", p)
    for rows in results.values():
        for row in rows:
            for kind in ("outofplace", "inplace"):
                wrong = row[kind].pop("wrong")
                assert wrong == (None if payload == "none" else 0), row
    return results, fabric


def _same(real: Any, none: Any) -> None:
    a, b = json.dumps(real, sort_keys=True), json.dumps(none, sort_keys=True)
    assert a == b


def test_flows_under_loss_on_a_fat_tree_time_the_same_without_their_bytes() -> None:
    real, none = _flows("real"), _flows("none")
    assert real[1]["retransmitted"] > 0 and real[1]["ecn_marked"] > 0  # the run is eventful
    _same(real, none)


@pytest.mark.parametrize(
    ("text", "algo"),
    [
        (leaf_spine(2, 4, 2), "ring"),
        (ai_zone(2, 2, 1, 4), "hierarchical"),  # NVLink servers of 4 accelerators, 2 zones
    ],
)
def test_collectives_under_loss_time_the_same_without_their_bytes(text: str, algo: str) -> None:
    real, none = _bench(text, "real", 0.002, algo), _bench(text, "none", 0.002, algo)
    assert real[1]["retransmitted"] > 0
    _same(real, none)


def test_an_elided_frame_is_its_headers_and_only_those_pass_as_one() -> None:
    """The headers of a whole frame decode as it (zeros for its payload, no ICRC); a frame cut
    anywhere else is truncated, in a timing-only NIC too."""
    tpl = FrameTemplate(vni=1, src_mac=b"\2" * 6, dst_mac=b"\4" * 6, src_ip=1, dst_ip=2, sport=5)
    whole = tpl.build(0x06, 7, 3, ext=pack_reth(64, 9, 1000), payload=b"\1" * 1000)
    elided = tpl.build(0x06, 7, 3, ext=pack_reth(64, 9, 1000), payload=b"\1" * 1000, elide=True)
    assert whole.startswith(elided) and len(whole) - len(elided) == 1000 + 4  # payload, ICRC
    frame = decode_frame_at(elided, VXLAN_LEN, False, True)
    assert isinstance(frame, RoceFrame) and frame.reth is not None
    assert bytes(frame.payload) == bytes(1000)
    for cut in (len(elided) - 1, len(elided) + 1, len(whole) - 1):
        with pytest.raises(MalformedFrame, match="truncated"):
            decode_frame_at(whole[:cut], VXLAN_LEN, False, True)
    with pytest.raises(MalformedFrame, match="truncated"):  # a real NIC refuses the headers
        decode_frame_at(elided, VXLAN_LEN)
