"""The switch pipeline and the fabric in virtual time: incast with and without PFC, ECMP,
rerouting, RED marking, PFC thresholds and pause timing, and the PFC watchdog."""

from __future__ import annotations

import math
import tomllib
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from rocev2_emu.nic.core import NicCore
from rocev2_emu.topology.file import parse
from rocev2_emu.topology.generate import leaf_spine, single_switch
from rocev2_emu.topology.model import Topology
from rocev2_emu.transport.memory import Access, MemoryRegion
from rocev2_emu.transport.qp import QueuePair
from rocev2_emu.transport.qp_state import QPAttr, QPState
from rocev2_emu.transport.work import CompletionQueue, SendWR, Sge, WcStatus, WrOpcode
from rocev2_emu.wire.ethernet import VXLAN_LEN, encode_vxlan
from rocev2_emu.wire.linerate import WIRE_OVERHEAD
from rocev2_emu.wire.pfc import decode_pfc_untrusted, encode_pfc
from rocev2_emu.wire.roce import FrameTemplate
from switch.config import EcnThresholds
from switch.mmu import Mmu, MmuConfig
from tests.unit.netsim import NetSim

RW = Access.LOCAL_WRITE | Access.REMOTE_WRITE | Access.REMOTE_READ


def topo(text: str, **overrides: dict[str, object]) -> Topology:
    data = tomllib.loads(text)
    for section, values in overrides.items():
        data.setdefault(section, {}).update(values)
    return parse(data, "test.toml")


@dataclass
class Flow:
    src_nic: NicCore
    qp: QueuePair
    cq: CompletionQueue
    src: np.ndarray
    dst: np.ndarray
    mr_src: MemoryRegion
    mr_dst: MemoryRegion


def connect(sim: NetSim, a: str, b: str, size: int, seed: int) -> Flow:
    na, nb = sim.nics[a], sim.nics[b]
    pa, pb = na.alloc_pd(), nb.alloc_pd()
    ca, cb = na.create_cq(), nb.create_cq()
    qa, qb = na.create_qp(pa, ca, ca), nb.create_qp(pb, cb, cb)
    for nic, qp, peer, ip in (
        (na, qa, qb, sim.topo.nodes[b].ip),
        (nb, qb, qa, sim.topo.nodes[a].ip),
    ):
        nic.modify_qp(qp, QPAttr(qp_state=QPState.INIT, port_num=1, qp_access_flags=RW))
        nic.modify_qp(
            qp,
            QPAttr(
                qp_state=QPState.RTR,
                path_mtu=sim.topo.mtu,
                dest_qp_num=peer.qpn,
                rq_psn=0,
                max_dest_rd_atomic=4,
                min_rnr_timer=1,
                ah_attr=ip,
            ),
        )
        nic.modify_qp(
            qp,
            QPAttr(
                qp_state=QPState.RTS,
                sq_psn=0,
                timeout=12,
                retry_cnt=7,
                rnr_retry=7,
                max_rd_atomic=4,
            ),
        )
    src = np.random.default_rng(seed).integers(0, 256, size, dtype=np.uint8)
    dst = np.zeros(size, dtype=np.uint8)
    ms, md = na.reg_mr(pa, src, RW), nb.reg_mr(pb, dst, RW)
    return Flow(na, qa, ca, src, dst, ms, md)


def start(f: Flow, chunk: int = 64 << 10) -> int:
    n = -(-len(f.src) // chunk)
    for k in range(n):
        length = min(chunk, len(f.src) - k * chunk)
        f.src_nic.post_send(
            f.qp,
            SendWR(
                k,
                WrOpcode.RDMA_WRITE,
                [Sge(f.mr_src.addr + k * chunk, length, f.mr_src.lkey)],
                remote_addr=f.mr_dst.addr + k * chunk,
                rkey=f.mr_dst.rkey,
            ),
        )
    return n


def finish(sim: NetSim, flows: list[Flow], counts: list[int], max_time: float = 2.0) -> None:
    done = [0] * len(flows)

    def all_done() -> bool:
        for i, f in enumerate(flows):
            for wc in f.cq.poll(1 << 16):
                assert wc.status is WcStatus.SUCCESS, wc
                done[i] += 1
        return done == counts

    sim.run(all_done, max_time=max_time)
    for f in flows:
        assert (f.src == f.dst).all()


def incast(pfc: bool, buffer_bytes: int) -> tuple[NetSim, list[Flow]]:
    t = topo(
        single_switch(5, delay_us=1.0),
        pfc={"enabled": pfc},
        buffer={"size_bytes": buffer_bytes, "headroom_bytes": 64 * 1024},
        ecn={"enabled": False},
    )
    sim = NetSim(t)
    flows = [connect(sim, f"h{i}", "h4", 1 << 20, i) for i in range(4)]
    counts = [start(f) for f in flows]
    finish(sim, flows, counts)
    return sim, flows


def test_incast_with_pfc_is_lossless_and_pauses_the_senders() -> None:
    sim, _ = incast(pfc=True, buffer_bytes=1 << 20)
    sw = sim.switches["sw0"]
    assert sum(sum(p.drops.values()) for p in sw.ports) == 0
    assert all(sw.ports[i].pfc_tx[3] > 0 for i in range(4))  # XOFF to every sender
    assert all(sim.nics[f"h{i}"].pause_frames_received[3] > 0 for i in range(4))
    assert all(sim.nics[f"h{i}"].counters.retransmitted_packets == 0 for i in range(4))
    assert sw.ports[4].paused_seconds(3, sim.now) == 0  # the receiver never paused the switch


def test_incast_without_pfc_drops_and_go_back_n_recovers() -> None:
    sim, _ = incast(pfc=False, buffer_bytes=600 * 1024)
    sw = sim.switches["sw0"]
    drops = sum(p.drops["buffer"] for p in sw.ports)
    assert drops > 0
    assert sum(p.pfc_tx[3] for p in sw.ports) == 0
    assert sum(sim.nics[f"h{i}"].counters.retransmitted_packets for i in range(4)) >= drops


def test_incast_is_deterministic() -> None:
    runs = []
    for _ in range(2):
        sim, _ = incast(pfc=False, buffer_bytes=600 * 1024)
        sw = sim.switches["sw0"]
        runs.append(([dict(p.drops) for p in sw.ports], [p.pfc_tx[3] for p in sw.ports], sim.now))
    assert runs[0] == runs[1]


def test_ecmp_spreads_64_qps_over_two_spines() -> None:
    t = topo(leaf_spine(2, 2, 2))
    sim = NetSim(t)
    flows = [connect(sim, f"h{i % 2}", f"h{2 + i % 2}", 4096, i) for i in range(64)]
    counts = [start(f) for f in flows]
    finish(sim, flows, counts)
    leaf0 = sim.switches["leaf0"]
    up = [leaf0.ports[p].tx_packets for p in range(2)]  # ports 0, 1 lead to the spines
    assert sum(up) >= 64
    assert abs(up[0] - up[1]) <= 0.2 * sum(up) / 2 * 2  # within +-20 % of the mean


def test_a_flow_survives_a_spine_link_going_down() -> None:
    t = topo(leaf_spine(2, 2, 1))
    sim = NetSim(t)
    f = connect(sim, "h0", "h1", 4 << 20, 1)
    n = start(f)
    sim.advance_to(50e-6)
    leaf0 = sim.switches["leaf0"]
    used = max(range(2), key=lambda p: leaf0.ports[p].tx_packets)
    link = t.nodes["leaf0"].ports[used][0]
    sim.set_link(link, up=False)
    finish(sim, [f], [n])
    other = 1 - used
    assert leaf0.ports[other].tx_packets > 0
    assert f.src_nic.counters.retransmitted_packets > 0 or leaf0.ports[used].drops["link_down"]


def test_red_marks_with_probability_between_kmin_and_kmax() -> None:
    t = topo(single_switch(2))
    sim = NetSim(t)
    sw = sim.switches["sw0"]
    sw.marker.ecn[1] = EcnThresholds(10_000, 30_000, 0.5)
    tpl = FrameTemplate(vni=1, src_mac=bytes(6), dst_mac=bytes(6), src_ip=1, dst_ip=2, sport=0xC000)
    datagram = tpl.build(4, 1, 0)
    not_ect = FrameTemplate(
        vni=1, src_mac=bytes(6), dst_mac=bytes(6), src_ip=1, dst_ip=2, sport=0xC000, ecn=0
    ).build(4, 1, 0)
    for depth, expected in ((5_000, 0.0), (20_000, 0.25), (25_000, 0.375), (40_000, 1.0)):
        marked = sum(sw.marker.mark(1, 3, datagram, depth)[23] & 3 == 3 for _ in range(4000))
        assert marked / 4000 == pytest.approx(expected, abs=0.03)
        assert all(sw.marker.mark(1, 3, not_ect, depth) == not_ect for _ in range(50))
    from rocev2_emu.wire.decode import decode_datagram_untrusted

    marked_frame = sw.marker.mark(1, 3, datagram, 40_000)
    assert decode_datagram_untrusted(marked_frame)[1].ecn == 3  # type: ignore[union-attr]


def test_static_xoff_and_xon_hysteresis() -> None:
    mmu = Mmu(
        MmuConfig(
            buffer_bytes=4 << 20,
            reserve_bytes=1000,
            headroom_bytes=20_000,
            xoff_bytes=10_000,
            xon_offset_bytes=4_000,
        ),
        2,
        frozenset({3}),
    )
    size = 1000
    queued = []
    while not mmu.should_pause(0, 3):
        where = mmu.admit_enqueue(0, 3, size)
        assert where == 0
        queued.append(False)
    assert mmu.shared_used(0, 3) == 10_000  # XOFF exactly at the threshold
    mmu.paused[0][3] = True
    while (where := mmu.admit_enqueue(0, 3, size)) >= 0:  # after XOFF: into the headroom
        assert where == 1
        queued.append(True)
    assert mmu.headroom_used[0][3] == 20_000
    resumed_at = None
    for from_headroom in reversed(queued):
        mmu.dequeue(0, 3, size, from_headroom)
        if mmu.should_resume(0, 3):
            resumed_at = mmu.shared_used(0, 3)
            break
    assert resumed_at == 6_000  # XON 4000 bytes below the XOFF threshold


def test_a_static_partition_keeps_each_port_to_its_share_of_a_deep_buffer() -> None:
    ports, gib = 4, 2**30
    static = Mmu(MmuConfig(2 * gib, 1000, 20_000, mode="static"), ports, frozenset({3}))
    shared = Mmu(MmuConfig(2 * gib, 1000, 20_000), ports, frozenset({3}))
    assert static.partition == (2 * gib - ports * (20_000 + 8 * 1000)) // ports
    size = 1 << 20
    # lossy traffic from port 0 fills exactly its partition, then tail-drops, in static mode;
    # the shared pool's dynamic threshold stops it at alpha x free instead
    taken = 0
    while static.admit_enqueue(0, 0, size) == 0:
        taken += size
    assert static.partition - size < taken - 1000 <= static.partition
    assert static.admit_enqueue(1, 0, size) == 0  # port 1's partition is untouched
    taken_shared = 0
    while shared.admit_enqueue(0, 0, size) == 0:
        taken_shared += size
    assert taken_shared < taken / 2  # alpha = 1/8 of what is free
    # lossless: XOFF when the port's partition is full, then the headroom, then drop
    small = Mmu(
        MmuConfig(buffer_bytes=1 << 20, reserve_bytes=1000, headroom_bytes=20_000, mode="static"),
        ports,
        frozenset({3}),
    )
    while (where := small.admit_enqueue(2, 3, 1000)) == 0:
        pass
    assert where == 1 and small.should_pause(2, 3)  # the partition is full: XOFF
    assert small.shared_used(2, 3) == small.partition // 1000 * 1000
    small.paused[2][3] = True
    assert all(small.admit_enqueue(2, 3, 1000) == 1 for _ in range(19))  # the headroom
    assert small.admit_enqueue(2, 3, 1000) == -1
    for _ in range(20):
        small.dequeue(2, 3, 1000, True)
    resumed = 0
    while not small.should_resume(2, 3):  # XON 8400 bytes below the partition
        small.dequeue(2, 3, 1000, False)
        resumed += 1
    assert resumed == 9
    with pytest.raises(ValueError, match="buffer mode 'deep'"):
        Mmu(MmuConfig(mode="deep"), 2, frozenset())


@pytest.mark.parametrize("gbps", [25, 100])
def test_a_pause_stops_a_switch_port_for_quanta_times_512_bit_times(gbps: int) -> None:
    t = topo(single_switch(2, rate_gbps=gbps))
    sim = NetSim(t)
    sw = sim.switches["sw0"]
    sw.receive(1, encode_vxlan(2, encode_pfc(bytes(6), {3: 1000})), 0.0)
    assert sw.ports[1].paused_until[3] == pytest.approx(1000 * 512 / (gbps * 1e9))
    assert sw.ports[1].pfc_rx[3] == 1


def test_watchdog_detects_a_storm_and_restores_after_it() -> None:
    t = topo(single_switch(2), pfc={"watchdog_detect_ms": 1.0, "watchdog_restore_ms": 2.0})
    sim = NetSim(t)
    sw = sim.switches["sw0"]
    storm = encode_vxlan(2, encode_pfc(bytes(6), {3: 0xFFFF}))  # 335 us at 100 Gbit/s
    f = connect(sim, "h0", "h1", 64 << 10, 1)
    start(f)
    t_ = 0.0
    while t_ < 3e-3:  # h1 pauses the switch without end
        sim.advance_to(t_)
        sw.receive(1, storm, sim.now)
        t_ += 100e-6
    assert sw.watchdog.storms_detected[1][3] == 1
    assert sw.ports[1].drops["pfc_watchdog"] > 0
    sim.advance_to(t_ + 2.5e-3)  # no pause for longer than the restoration time
    assert sw.watchdog.storms_restored[1][3] == 1
    assert not sw.watchdog.stormed[1][3]


def test_virtual_mode_runs_the_real_drivers_and_repeats_exactly(
    tmp_path: object, capsys: pytest.CaptureFixture[str]
) -> None:
    from pathlib import Path

    from rocev2_emu.fabric.flow_run import up
    from rocev2_emu.fabric.options import Clock, RunOptions

    assert isinstance(tmp_path, Path)
    data = tomllib.loads(single_switch(5))
    data["buffer"] = {"size_bytes": 600 * 1024, "headroom_bytes": 0}
    data["pfc"] = {"enabled": False}
    data["transport"] = {"qp_timeout": 8}
    t = parse(data, "incast.toml")
    flows_file = tmp_path / "flows.toml"
    flows_file.write_text(
        "".join(f'[[flow]]\nsrc = "h{i}"\ndst = "h4"\nsize = 524288\n\n' for i in range(4))
    )
    outputs = []
    for _ in range(2):
        assert up(t, "incast.toml", RunOptions(Clock.VIRTUAL), flows_path=str(flows_file)) == 0
        outputs.append(capsys.readouterr().out)
    assert outputs[0] == outputs[1]  # same drops, same FCTs, to the tenth of a microsecond
    assert outputs[0].count("ok, verified") == 4
    assert "'buffer':" in outputs[0]  # the lossy incast really dropped


def test_a_slow_receiver_pauses_its_switch_and_the_pause_spreads_upstream() -> None:
    data = tomllib.loads(single_switch(3))
    data["host"][2]["rx_gbps"] = 25.0  # h2 drains its NIC at a quarter of the link rate
    data["ecn"] = {"enabled": False}
    data["buffer"] = {"size_bytes": 1 << 20, "headroom_bytes": 64 * 1024}
    sim = NetSim(parse(data, "slow.toml"))
    flows = [connect(sim, "h0", "h2", 2 << 20, 1)]
    finish(sim, flows, [start(flows[0])])
    sw = sim.switches["sw0"]
    h2 = sim.nics["h2"]
    assert h2.ingress is not None and h2.ingress.pfc_sent > 0  # XOFF from the edge ...
    assert sw.ports[2].pfc_rx[3] > 0 and sw.ports[2].paused_seconds(3, sim.now) > 0
    assert sw.ports[0].pfc_tx[3] > 0  # ... and the switch, filling up, pauses the sender
    assert sim.nics["h0"].pause_frames_received[3] > 0
    assert sum(sum(p.drops.values()) for p in sw.ports) == 0
    assert h2.counters.rx_drops["rx_buffer_full"] == 0
    # the transfer took about as long as the slow host needs, not the 100 Gbit/s link
    assert sim.now == pytest.approx((2 << 20) * 8 / 25e9, rel=0.1)


def _spine_ports_used(ecmp: str, pairs: list[tuple[str, str]]) -> list[int]:
    """Packets leaf0 sent up each spine port for 32 QPs per (src, dst) pair, under ``ecmp``."""
    t = topo(leaf_spine(2, 2, 2), fabric={"ecmp": ecmp})
    sim = NetSim(t)
    flows = [connect(sim, a, b, 4096, i) for i, (a, b) in enumerate(pairs * 32)]
    counts = [start(f) for f in flows]
    finish(sim, flows, counts)
    assert all(np.array_equal(f.src, f.dst) for f in flows)
    leaf0 = sim.switches["leaf0"]
    return [leaf0.ports[p].tx_packets for p in range(2)]  # ports 0, 1 lead to the spines


def test_path_pinning_sends_every_flow_to_one_host_on_one_path() -> None:
    to_h2 = _spine_ports_used("destination", [("h0", "h2"), ("h1", "h2")])
    assert sorted(to_h2)[0] == 0 and sorted(to_h2)[1] >= 64  # 64 QPs, one spine
    to_both = _spine_ports_used("destination", [("h0", "h2"), ("h0", "h3")])
    assert min(to_both) > 0.4 * sum(to_both) / 2  # consecutive hosts: the other spine
    hashed = _spine_ports_used("5-tuple", [("h0", "h2"), ("h1", "h2")])
    assert min(hashed) > 0.2 * sum(hashed) / 2  # the 5-tuple spreads the same QPs


def test_e_ecmp_hashes_the_destination_qp_and_keeps_each_flow_on_one_path() -> None:
    from switch.config import PortConfig, SwitchConfig
    from switch.pipeline import SwitchCore

    def frame(dst_qp: int, opcode: int, length: int) -> bytes:
        ip = bytes(12) + bytes([10, 0, 0, 1, 10, 0, 0, 2])  # src, dst
        udp = (49152).to_bytes(2, "big") + (4791).to_bytes(2, "big") + length.to_bytes(2, "big")
        bth = bytes([opcode, 0, 0xFF, 0xFF, 0]) + dst_qp.to_bytes(3, "big") + bytes(4)
        return bytes(22) + ip + udp + bytes(2) + bth

    def paths(ecmp: str) -> dict[int, set[int]]:
        ports = [PortConfig(i, i + 1, 100e9, bytes(6), bytes(6)) for i in range(4)]
        core = SwitchCore(SwitchConfig("s", ports, {}, ecmp=ecmp, seed=3))
        chosen: dict[int, set[int]] = {}
        for qp in range(1, 65):
            for opcode, length in ((6, 4136), (7, 4136), (8, 100)):  # FIRST, MIDDLE, LAST
                data = frame(qp, opcode, length)
                out = core.forwarding.ecmp(data[22:42], data, (0, 1, 2, 3))
                assert out is not None
                chosen.setdefault(qp, set()).add(out)
        return chosen

    five = paths("5-tuple")
    assert len(set().union(*five.values())) == 1  # one 5-tuple: one path for every QP
    qpn = paths("5-tuple+qpn")
    assert all(len(p) == 1 for p in qpn.values())  # a flow's packets never change path
    assert len(set().union(*qpn.values())) == 4  # the destination QPs spread over all four


def test_a_paused_sender_puts_one_round_trip_of_frames_on_the_wire_after_xoff() -> None:
    """4 -> 1 at 100 Gbit/s over 1 us links, MTU 4096, a static XOFF threshold: the switch
    decides XOFF when a frame is enqueued, the PFC frame leaves ahead of any queued data (at
    most behind the frame already on the wire), and the sender honours it before its next
    frame - so after each XOFF exactly the frames started within one round trip of the frame
    that crossed the threshold still arrive: floor(2 x delay / frame time) = 5 here, never 6
    (a pause that waited behind queued data or took effect a frame late would make it 6).
    docs/fabric.md, "PFC: when a pause takes effect", compares this with htsim."""
    t = topo(
        single_switch(5, delay_us=1.0),
        buffer={"size_bytes": 1 << 20, "headroom_bytes": 64 * 1024, "xoff_bytes": 15 * 4096},
        ecn={"enabled": False},
    )
    sim = NetSim(t)
    arrivals: list[tuple[float, str, bytes]] = []  # (arrival time, sending node, datagram)
    for name, node in zip(t.nodes, sim.nodes, strict=True):
        for wire in node.wires:
            assert wire is not None and wire.faulty is not None
            inner = wire.faulty

            def fates(
                datagram: bytes, now: float, inner: Any = inner, name: str = name
            ) -> list[tuple[float, bytes]]:
                out: list[tuple[float, bytes]] = inner.fates(datagram, now)
                arrivals.extend((at, name, bytes(data)) for at, data in out)
                return out

            wire.faulty = SimpleNamespace(fates=fates)
    flows = [connect(sim, f"h{i}", "h4", 1 << 20, i) for i in range(4)]
    finish(sim, flows, [start(f) for f in flows])

    frame_time = (4096 + 58 + WIRE_OVERHEAD) * 8 / 100e9  # RoCE WRITE MIDDLE of 4 KiB
    bound = math.floor(2 * 1e-6 / frame_time)
    assert bound == 5
    counts = []
    for host in ("h0", "h1", "h2", "h3"):
        link, _ = t.host_link(host)
        at_switch: list[tuple[float, int]] = []  # (time at the switch, +1 XOFF / 0 XON / -1 data)
        for at, sender, data in arrivals:
            if sender == "sw0" and int.from_bytes(data[4:7], "big") == link.vni:
                if data[VXLAN_LEN + 12 : VXLAN_LEN + 14] == b"\x88\x08":  # PFC to the host
                    quanta = decode_pfc_untrusted(data[VXLAN_LEN:]).quanta[3]
                    at_switch.append((at - link.delay, 1 if quanta else 0))  # when it left
            elif sender == host and len(data) > 4000:
                at_switch.append((at, -1))  # a data frame of the host reaching the switch
        paused, after = False, 0
        for _, kind in sorted(at_switch):
            if kind == 1:
                paused, after = True, 0
            elif kind == 0 and paused:
                counts.append(after)
                paused = False
            elif kind == -1 and paused:
                after += 1
    assert len(counts) >= 8  # every sender was paused and resumed, more than once
    assert max(counts) == bound, counts
    assert sorted(counts)[len(counts) // 2] == bound, counts  # fewer only as a flow ends
