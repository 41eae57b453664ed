"""``algo="auto"``'s model (collectives/comm/cost.py): the hierarchy's bandwidth time over the
ring's for the shapes measured in docs/collectives.md, and the schedule it picks for each."""

from __future__ import annotations

import tomllib

import pytest

from collectives.comm.cost import choose, hierarchy_ratio
from collectives.comm.placement import Hierarchy, hierarchy
from collectives.jobs.places import places_for
from rocev2_emu.topology.file import parse
from rocev2_emu.topology.generate import Servers, fat_tree, leaf_spine, single_switch

SLOT = 256 << 10


def shape(text: str) -> tuple[Hierarchy, int]:
    places = places_for(parse(tomllib.loads(text)))
    return hierarchy(places), len(places)


@pytest.mark.parametrize(
    ("text", "server_gbps", "ratio", "at_4mib"),
    [
        # 2 servers x 4 on one switch: the NICs carry S against the ring's 1.75 S
        (single_switch(2, servers=Servers(4, "free")), 0.0, 1 / 1.75, "hierarchical"),
        (single_switch(2, servers=Servers(4)), 3600.0, (1 + 1.5 / 36) / 1.75, "hierarchical"),
        (
            single_switch(2, servers=Servers(4, "pcie")),
            504.0,
            (1 + 1.5 / 5.04) / 1.75,
            "hierarchical",
        ),
        # 8 servers x 4 on the leaf-spine: 1.75 S against 1.94 S, under the threshold's margin
        (leaf_spine(2, 4, 2, servers=Servers(4)), 3600.0, (1.75 + 1.5 / 36) / (62 / 32), "ring"),
        # one rank a host: the hierarchy moves what the ring moves
        (leaf_spine(2, 4, 2), 0.0, 1.0, "ring"),
        (fat_tree(4), 0.0, 1.0, "ring"),
    ],
)
def test_the_model_gives_the_measured_choice(
    text: str, server_gbps: float, ratio: float, at_4mib: str
) -> None:
    h, n = shape(text)
    assert hierarchy_ratio(h, n, 100.0, server_gbps) == pytest.approx(ratio)
    assert choose(h, n, 4 << 20, SLOT, 100.0, server_gbps) == at_4mib
    assert choose(h, n, 16 << 10, SLOT, 100.0, server_gbps) == "hierarchical"


def test_a_ring_of_small_chunks_gives_way_to_the_hierarchy() -> None:
    """128 ranks, one a host (k = 8 fat-tree): the bandwidth model sees no gain in the hierarchy,
    but below 32 KiB a chunk the ring's 254 steps are latency (docs/collectives.md, "Choosing
    the schedule")."""
    h, n = shape(fat_tree(8))
    assert n == 128 and hierarchy_ratio(h, n, 100.0, 0.0) == pytest.approx(1.0)
    assert choose(h, n, 1 << 20, SLOT, 100.0, 0.0) == "hierarchical"  # 8 KiB chunks
    assert choose(h, n, (4 << 20) - 4, SLOT, 100.0, 0.0) == "hierarchical"
    assert choose(h, n, 4 << 20, SLOT, 100.0, 0.0) == "ring"  # 32 KiB: a tie, the ring stays


def test_no_hierarchy_is_a_ring() -> None:
    h, n = shape(single_switch(4))
    assert not h.levels
    assert hierarchy_ratio(h, n, 100.0, 0.0) == float("inf")
    assert choose(h, n, 1024, SLOT, 100.0, 0.0) == "ring"
