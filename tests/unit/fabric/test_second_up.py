"""A second ``up`` of a running fabric is refused in one line, before it starts anything."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from rocev2_emu.cli import main
from rocev2_emu.fabric import blocks
from rocev2_emu.fabric.supervisor import FabricBusy, refuse_taken
from rocev2_emu.topology.file import load
from rocev2_emu.topology.generate import single_switch
from rocev2_emu.topology.model import Topology
from rocev2_emu.wire.ethernet import LINK_UDP_PORT


def _free_block(topo: Topology) -> int:
    """A block of 127/8 where no node of ``topo`` is taken (another fabric may run on the
    default block beside the tests)."""
    for block in range(blocks.FIRST, blocks.LAST + 1):
        if blocks.first_taken(blocks.relocate(topo, block), list(topo.nodes)) is None:
            return block
    pytest.fail("no block of 127/8 is free")


def test_a_taken_node_address_refuses_the_fabric_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "two.toml"
    path.write_text(single_switch(2))
    monkeypatch.setenv(blocks.ENV, str(_free_block(load(path))))  # as a fabric's own run says
    topo = blocks.running(load(path), str(path))
    refuse_taken(topo, str(path), list(topo.nodes))  # all free: nothing said
    h1 = topo.nodes["h1"].address
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as running:  # the first fabric's h1
        running.bind((h1, LINK_UDP_PORT))
        with pytest.raises(FabricBusy, match=rf"{h1}:{LINK_UDP_PORT} \(h1 of .*\) is in use"):
            refuse_taken(topo, str(path), list(topo.nodes))
        refuse_taken(topo, str(path), ["sw0", "h0"])  # only the nodes this run starts count
        assert main(["up", str(path)]) == 1
    out, err = capsys.readouterr()
    assert err.count("\n") == 1 and "is running already" in err, err
    assert "ready" not in out  # no node was started
