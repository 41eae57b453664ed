"""PFC headroom per port, as each link needs it (switch/mmu.py ``pfc_headroom``): a fast or
long link's port takes what arrives between its XOFF and the upstream's stop, a slow one the
file's default; the topology file checks the buffer against the sum; and the 64-rank AI zone
whose 3.6 Tb/s uplinks dropped lossless frames out of a 96 KiB headroom no longer drops."""

from __future__ import annotations

import tomllib

import pytest

from collectives.bench.nccl import params
from collectives.jobs.job import run_virtual
from rocev2_emu.topology.file import parse
from rocev2_emu.topology.generate import ai_zone, leaf_spine
from switch.mmu import ADMIT_DROP, ADMIT_HEADROOM, Mmu, MmuConfig, pfc_headroom


def test_the_headroom_is_two_bandwidth_delay_products_and_three_frames() -> None:
    frames = 3 * (4096 + 128)
    assert pfc_headroom(100e9, 1e-6, 4096) == 25_000 + frames  # under the 96 KiB default
    assert pfc_headroom(400e9, 1e-6, 4096) == 100_000 + frames
    assert pfc_headroom(400e9, 2e-6, 4096) == 200_000 + frames  # twice the cable, twice that
    assert pfc_headroom(0.0, 1e-6, 4096) == 0  # unpaced: the default


def test_each_port_takes_its_own_headroom_after_xoff_and_drops_only_beyond_it() -> None:
    config = MmuConfig(buffer_bytes=4 << 20, reserve_bytes=0, headroom_bytes=10_000, xoff_bytes=1)
    mmu = Mmu(config, 2, frozenset({3}), [0, 50_000])  # port 0: the default; port 1: its link's
    assert mmu.port_headroom == [10_000, 50_000]
    assert mmu.shared_size == (4 << 20) - 60_000
    for port, room in ((0, 10_000), (1, 50_000)):
        mmu.paused[port][3] = True  # after XOFF every lossless byte goes to the headroom
        taken = 0
        while mmu.admit_enqueue(port, 3, 1000) == ADMIT_HEADROOM:
            taken += 1000
        assert taken == room
        assert mmu.admit_enqueue(port, 3, 1000) == ADMIT_DROP
    with pytest.raises(ValueError, match="3 headrooms for 2 ports"):
        Mmu(config, 2, frozenset({3}), [0, 0, 0])


def test_a_switch_sizes_each_port_s_headroom_from_its_link_and_the_file_checks_the_sum() -> None:
    data = tomllib.loads(leaf_spine(1, 1, 2))
    data["link"][0]["rate_gbps"] = 3600.0  # the leaf's uplink, a bundle of 400G links
    topo = parse(data, "leaf-spine.toml")
    ports = {p.peer_name: p.headroom_bytes for p in topo.switch_config("leaf0").ports}
    assert ports["spine0"] == pfc_headroom(3600e9, 1e-6, 4096)  # 912 672: above the default
    assert ports["h0"] == pfc_headroom(100e9, 1e-6, 4096)  # below: the MMU takes 96 KiB
    data["buffer"] = {"size_bytes": 1 << 20}
    with pytest.raises(Exception, match="need 1207584 bytes of headroom"):
        parse(data, "leaf-spine.toml")  # 912 672 + 2 x 96 KiB + 3 ports x 8 x 4 KiB
    # without PFC nothing is lossless: no port holds headroom for its link (the file's stays)
    data["pfc"] = {"enabled": False}
    data["buffer"] = {"size_bytes": 400 << 10, "headroom_bytes": 0}
    lossy = parse(data, "leaf-spine.toml")
    assert [p.headroom_bytes for p in lossy.switch_config("leaf0").ports] == [0, 0, 0]


def test_a_400g_ai_zone_s_16_mib_all_reduce_pauses_without_dropping() -> None:
    """2 zones x 2 racks of two 8-accelerator servers: the RTSWs' uplinks run at 3.6 Tb/s and
    the CTSWs' at 1.03 Tb/s; with 96 KiB of headroom on every port the hierarchical all-reduce
    lost lossless frames out of it (docs/benchmarks.md)."""
    topo = parse(tomllib.loads(ai_zone(2, 2, 2, 8)), "zone.toml")
    topo.payload = "none"  # the timing is the real run's; 2 s here
    job = params([16 << 20], algo="hierarchical", iters=1, warmup=0)
    _, fabric = run_virtual(topo, "bench", job)
    assert fabric["drops"] == {}, fabric["drops"]
    assert fabric["retransmitted"] == 0
