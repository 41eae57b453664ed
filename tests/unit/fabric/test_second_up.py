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
from rocev2_emu.wire.ethernet import LINK_UDP_PORT


def test_a_taken_node_address_refuses_the_fabric_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "two.toml"
    path.write_text(single_switch(2))
    two = load(path)  # (another fabric may run on 127.10 beside the tests)
    monkeypatch.setenv(blocks.ENV, str(blocks.first_free(two, list(two.nodes))))
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
