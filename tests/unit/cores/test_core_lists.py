"""The two lists of "the cores" cannot drift: every module of the sans-IO contract
(pyproject.toml's import-linter contract that forbids trio, socket and time) is compiled
(``[tool.rocev2-emu] compiled-cores``) and everything compiled is sans-IO, but for the
exceptions named here with why - the collectives' ring operation and link ends (compiled, a
NIC's completion handler runs them per chunk; they import trio for the task that waits on an
operation) and the pcap writer and the exact mode's messages and decisions (sans-IO, not
compiled: their cost is the file's, or a window's)."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
# compiled, not sans-IO: they run per chunk inside the NIC's completion handler, and import
# trio (an operation's caller awaits its end) and numpy
COMPILED_BEYOND_SANS_IO = {"collectives.comm.links", "collectives.comm.ring"}
# sans-IO, not compiled: the pcap writer's cost is the file's, not the interpreter's; the
# exact mode's messages and its coordinator's decisions run once a window, not once a frame
SANS_IO_NOT_COMPILED = {
    "rocev2_emu.wire.pcap",
    "rocev2_emu.runtime.sync_messages",
    "rocev2_emu.runtime.rounds",
}


def _lists() -> tuple[set[str], list[str]]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    compiled = {
        p[: -len(".py")].replace("/", ".") for p in config["tool"]["rocev2-emu"]["compiled-cores"]
    }
    (contract,) = [
        c
        for c in config["tool"]["importlinter"]["contracts"]
        if c["type"] == "forbidden" and "trio" in c["forbidden_modules"]
    ]
    return compiled, contract["source_modules"]


def test_every_sans_io_module_is_compiled_and_nothing_else_but_the_named_ones() -> None:
    compiled, sans_io = _lists()
    covered: set[str] = set()
    for name in sans_io:
        folder = ROOT.joinpath(*name.split("."))
        if folder.is_dir():  # a package: every module in it
            members = {f"{name}.{p.stem}" for p in folder.glob("*.py") if p.stem != "__init__"}
        else:
            members = {name}
        missing = members - compiled - SANS_IO_NOT_COMPILED
        assert not missing, f"sans-IO but not compiled: {sorted(missing)}"
        covered |= members
    beyond = compiled - covered
    assert beyond == COMPILED_BEYOND_SANS_IO, f"compiled, neither sans-IO nor named: {beyond}"
    assert covered - compiled >= SANS_IO_NOT_COMPILED  # (an exception that is no longer one)
