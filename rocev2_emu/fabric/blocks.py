"""Each run of node processes on its own block of 127/8, so two runs on one machine - a test
suite beside a demo, two seeds of a sweep - do not collide.

A topology that does not pin its addresses (no ``[fabric] subnet``) puts node i on
127.10.(i // 200).(i % 200 + 10).  A run that starts its nodes takes the first block
127.B.0.0/16 (B from 10 to 250) where every node's link port is free, and says which when it
is not 10; a fabric left running (``up``) takes the block its own topology's run says first,
so that a second ``up`` of a running fabric is refused there rather than started beside it.
The block reaches the run's node processes in their environment (:data:`ENV`), and
the commands that talk to a running fabric (``link``, ``stop``, ``bench --attach``) find it in
the run directory beside the fabric's secret (:func:`blocks_file`), kept while the run lives.
A topology with a subnet (containers, swarm) keeps its addresses.  Grows with the nodes (one
probe each per block tried).
"""

from __future__ import annotations

import contextlib
import errno
import os
import socket
from collections.abc import Collection
from pathlib import Path
from typing import Final

from rocev2_emu.control import auth
from rocev2_emu.topology.model import Topology
from rocev2_emu.wire.ethernet import LINK_UDP_PORT

ENV: Final = "ROCEV2_EMU_BLOCK"  # the second octet of a run's 127/8 block
FIRST: Final = 10
LAST: Final = 250


def relocatable(topo: Topology) -> bool:
    """Whether the topology leaves its nodes' addresses to the run (no subnet)."""
    return topo.subnet == ""


def relocate(topo: Topology, block: int) -> Topology:
    """``topo`` with every node on 127.``block``.x.y (as parsed: 127.10.x.y)."""
    if not FIRST <= block <= LAST:
        raise ValueError(f"${ENV} = {block}: a block of 127/8 from {FIRST} to {LAST}")
    if relocatable(topo):
        for node in topo.nodes.values():
            i = node.index
            node.address = f"127.{block}.{i // 200}.{i % 200 + 10}"
    return topo


def blocks_file(topology_path: str) -> Path:
    """Where a running fabric of ``topology_path`` says its block (beside its secret)."""
    return auth.run_file(topology_path).with_suffix(".block")


def running(topo: Topology, topology_path: str) -> Topology:
    """``topo`` on the block its run took: the environment's (a node process of the run), the
    run directory's (a command talking to the running fabric), else as parsed."""
    said = os.environ.get(ENV)
    if said is None:
        with contextlib.suppress(OSError, ValueError):
            said = blocks_file(topology_path).read_text().strip()
    if said is None or not relocatable(topo):
        return topo
    try:
        block = int(said)
    except ValueError:
        raise ValueError(f"${ENV} = {said!r}: a block of 127/8 from {FIRST} to {LAST}") from None
    return relocate(topo, block)


def first_taken(topo: Topology, names: Collection[str]) -> str | None:
    """The first of ``names`` whose link port (UDP ``LINK_UDP_PORT`` on its address) another
    process holds; None when every one is free."""
    for name in names:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            try:
                probe.bind((topo.nodes[name].address, LINK_UDP_PORT))
            except OSError as exc:
                if exc.errno != errno.EADDRINUSE:
                    raise
                return name
    return None


def take(
    topo: Topology, topology_path: str, names: Collection[str], *, own_first: bool = False
) -> int | None:
    """Put the run's nodes (``names``) on the first block where each one's link port is free,
    say it in the run directory, and return it (None: the topology pins its addresses, or the
    environment names the block - both are kept as they are).  ``own_first``: where the run
    directory says a block that is taken (this topology's fabric runs there), the nodes go on
    it and None is returned - the caller's check of the addresses then refuses the run."""
    if not relocatable(topo) or ENV in os.environ:
        return None
    if own_first:
        try:
            said = int(blocks_file(topology_path).read_text().strip())
        except (OSError, ValueError):
            said = None
        if (
            said is not None
            and FIRST <= said <= LAST
            and first_taken(relocate(topo, said), names) is not None
        ):
            return None
    block = first_free(topo, names)
    if block is None:
        relocate(topo, FIRST)
        return None  # every block taken: the first one's error names the address
    with contextlib.suppress(OSError):
        blocks_file(topology_path).write_text(f"{block}\n")
    return block


def first_free(topo: Topology, names: Collection[str]) -> int | None:
    """The first block where the link port of each of ``names`` is free, ``topo`` put on it;
    None when there is none."""
    for block in range(FIRST, LAST + 1):
        if first_taken(relocate(topo, block), names) is None:
            return block
    return None


def release(topology_path: str, block: int | None) -> None:
    """The run is over: its block is no longer said (if it still says this run's)."""
    if block is None:
        return
    path = blocks_file(topology_path)
    with contextlib.suppress(OSError):
        if path.read_text().strip() == str(block):
            path.unlink()
