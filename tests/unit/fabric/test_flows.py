"""Flows files are checked as strictly as topology files: each error names file, flow and key."""

from __future__ import annotations

import tomllib
from pathlib import Path

import numpy as np
import pytest

from rocev2_emu.fabric.agent import FlowSpec, HostAgent, flow_data
from rocev2_emu.fabric.flows import load_flows
from rocev2_emu.topology.file import parse
from rocev2_emu.topology.generate import single_switch
from rocev2_emu.topology.model import TopologyError

TOPO = parse(tomllib.loads(single_switch(3)), "three.toml")


def flows(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "flows.toml"
    path.write_text(body)
    return path


def test_a_good_flows_file_loads() -> None:
    path = Path(__file__).resolve().parents[3] / "examples" / "flows" / "incast-4to1.toml"
    topo = parse(tomllib.loads(single_switch(5)), "five.toml")
    loaded = load_flows(path, topo)
    assert len(loaded) == 4 and {f.dst for f in loaded} == {"h4"}


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ('[[flow]]\nsrc = "h0"\ndst = "h1"\nsise = 10\n', "unknown key(s) ['sise']"),
        ('[[flow]]\nsrc = "h0"\ndst = "h1"\nsize = 1\nstart_usec = 5\n', "['start_usec']"),
        ('[[flow]]\nsrc = "h0"\ndst = "h1"\nsize = 1\ndcsp = 26\n', "['dcsp']"),
        ('[[flow]]\nsrc = "h0"\ndst = "h0"\nsize = 1\n', "two different hosts"),
        ('[[flow]]\nsrc = "h0"\ndst = "h9"\nsize = 1\n', "dst = 'h9': no such host"),
        ('[[flow]]\nsrc = "h0"\ndst = "h1"\nsize = -1\n', "size = -1"),
        ('[[flow]]\nsrc = "h0"\ndst = "h1"\nsize = 1\ndscp = 99\n', "dscp = 99"),
        ('[[flow]]\nsrc = "h0"\ndst = "h1"\nsize = 1\nstart_us = -3.0\n', "start_us = -3.0"),
        ('[[flows]]\nsrc = "h0"\n', "unknown section(s) ['flows']"),
    ],
)
def test_bad_flows_name_the_flow_and_the_key(tmp_path: Path, body: str, says: str) -> None:
    with pytest.raises(TopologyError, match=r"flows\.toml") as err:
        load_flows(flows(tmp_path, body), TOPO)
    assert says in str(err.value)


def test_a_flows_bytes_are_fixed_by_its_id_and_as_long_as_it() -> None:
    one, again, other = (flow_data(FlowSpec(i, "h0", "h1", 1001)) for i in (5, 5, 6))
    assert (
        one.dtype == np.uint8 and len(one) == 1001 and len(flow_data(FlowSpec(5, "a", "b", 0))) == 0
    )
    assert np.array_equal(one, again) and not np.array_equal(one, other)


def test_no_two_blocks_of_flows_are_alike() -> None:
    """A block delivered to the wrong offset, or into another flow, is caught."""
    block = 64 << 10
    a, b = (flow_data(FlowSpec(i, "h0", "h1", 3 * block)).reshape(3, block) for i in (1, 2))
    blocks = list(a) + list(b)
    assert all(not np.array_equal(x, y) for i, x in enumerate(blocks) for y in blocks[i + 1 :])


async def test_a_destination_holds_a_flow_only_if_every_byte_is_the_sources() -> None:
    """The in-process check of a flow's bytes (no digests): one byte off is not verified."""
    data = flow_data(FlowSpec(1, "h0", "h1", 4096))
    agent = HostAgent.__new__(HostAgent)  # its buffers alone: no NIC needed to compare them
    agent._inbound = {1: (None, None, data.copy()), 2: (None, None, data.copy())}  # type: ignore[dict-item]
    agent._inbound[2][2][4095] ^= 1
    assert await agent.holds(1, data) and not await agent.holds(2, data)
    assert agent._inbound == {}  # a flow's inbound state ends with its check


async def test_an_exact_flows_job_names_the_node_processes_that_never_joined() -> None:
    """The flows job on the exact clock waits for its processes through the same handle as a
    collective job: one SyncError naming the missing, not a bare timeout."""
    from rocev2_emu.fabric.flows import FlowsJob
    from rocev2_emu.runtime.coordinator import Coordinator
    from rocev2_emu.runtime.sync_messages import SyncError

    coordinator = Coordinator(["sw0", "h0", "h1", "h2"], 1e-6, b"")
    job = FlowsJob([FlowSpec(0, "h0", "h2", 4096)], coordinator=coordinator, join_timeout=0.2)
    with pytest.raises(SyncError, match=r"not joined within 0.2 s: h0, h1, h2, sw0$"):
        await job.run(TOPO, 1.0, 0.0)
