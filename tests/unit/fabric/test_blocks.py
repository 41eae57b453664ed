"""A run's block of 127/8 (rocev2_emu/fabric/blocks.py): relocated addresses, the block found
by a node process (its environment) and by a command talking to the run (the run directory),
and a topology with a subnet kept as it is."""

from __future__ import annotations

import socket
import tomllib
from pathlib import Path

import pytest

from rocev2_emu.fabric import blocks
from rocev2_emu.topology.file import load, parse
from rocev2_emu.topology.generate import single_switch
from rocev2_emu.wire.ethernet import LINK_UDP_PORT


def test_a_run_takes_the_first_free_block_and_its_commands_find_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(blocks.ENV, raising=False)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    path = tmp_path / "two.toml"
    path.write_text(single_switch(2))
    topo = load(path)
    assert topo.nodes["sw0"].address == "127.10.0.10"
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as taken:
        for block in range(10, 250):  # the first free one is another run's
            try:
                taken.bind((f"127.{block}.0.11", LINK_UDP_PORT))  # its h0
                break
            except OSError:
                continue
        got = blocks.take(topo, str(path), list(topo.nodes))
        assert got is not None and got > block
    assert topo.nodes["h0"].address == f"127.{got}.0.11"
    assert blocks.running(load(path), str(path)).nodes["h1"].address == f"127.{got}.0.12"
    monkeypatch.setenv(blocks.ENV, "42")  # a node process of a run on 127.42/16
    assert blocks.running(load(path), str(path)).nodes["sw0"].address == "127.42.0.10"
    assert blocks.take(load(path), str(path), ["sw0"]) is None  # the environment decides
    monkeypatch.delenv(blocks.ENV)
    blocks.release(str(path), got)
    assert blocks.running(load(path), str(path)).nodes["sw0"].address == "127.10.0.10"
    with pytest.raises(ValueError, match="a block of 127/8"):
        blocks.relocate(topo, 251)


def test_a_topology_with_a_subnet_keeps_its_addresses() -> None:
    data = tomllib.loads(single_switch(2))
    data["fabric"]["subnet"] = "172.30.0.0/24"
    topo = parse(data, "testbed.toml")
    assert blocks.take(topo, "testbed.toml", list(topo.nodes)) is None
    assert blocks.relocate(topo, 11).nodes["sw0"].address == "172.30.0.10"


def test_a_fabric_left_running_takes_a_free_block_unless_its_own_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(blocks.ENV, raising=False)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    path = tmp_path / "two.toml"
    path.write_text(single_switch(2))
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as other:  # another fabric's node
        for block in range(10, 250):
            try:
                other.bind((f"127.{block}.0.11", LINK_UDP_PORT))
                break
            except OSError:
                continue
        topo = load(path)
        got = blocks.take(topo, str(path), list(topo.nodes), own_first=True)
        assert got is not None and got > block  # beside the other fabric, not refused
        assert blocks.running(load(path), str(path)).nodes["h0"].address == f"127.{got}.0.11"
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as own:  # this fabric's h1
            own.bind((f"127.{got}.0.12", LINK_UDP_PORT))
            again = load(path)
            assert blocks.take(again, str(path), list(again.nodes), own_first=True) is None
            assert again.nodes["h1"].address == f"127.{got}.0.12"  # where the refusal looks
    blocks.release(str(path), got)
