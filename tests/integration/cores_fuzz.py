"""Seeded fuzzing of the cores' receive paths, whose counters both builds must print byte for
byte (tests/integration/test_cores_build.py): ``python -m tests.integration.cores_fuzz [N] [SEED]``.

A switch of a single-switch fabric and the NIC of a host with a connected queue pair take N
datagrams each: well-formed RoCE frames with random fields (opcode, PSN, QP, RETH), frames
with bytes flipped, cut or appended, IPv4 headers with a valid checksum over a random total
length, PFC frames with random bytes, and random bytes.  No input may raise; what each core
counted (drops by reason, packets, what it sent) is printed as JSON.  Grows with N only.
"""

from __future__ import annotations

import json
import random
import sys
import tomllib
from typing import Any

import numpy as np

from rocev2_emu import cores
from rocev2_emu.nic.config import NicConfig
from rocev2_emu.nic.core import NicCore
from rocev2_emu.topology.file import parse
from rocev2_emu.topology.generate import single_switch
from rocev2_emu.transport.memory import Access
from rocev2_emu.transport.qp import QueuePair
from rocev2_emu.transport.qp_state import QPAttr, QPState
from rocev2_emu.wire.ethernet import VXLAN_LEN, encode_vxlan, ip_to_int, ipv4_checksum
from rocev2_emu.wire.pfc import encode_pfc
from rocev2_emu.wire.roce import FrameTemplate, pack_aeth, pack_reth
from switch.pipeline import SwitchCore

_RW = Access.LOCAL_WRITE | Access.REMOTE_WRITE | Access.REMOTE_READ | Access.REMOTE_ATOMIC
_IP = VXLAN_LEN + 14  # the IPv4 header's offset in a datagram


def _nic(topo: Any, name: str) -> NicCore:
    link, leaf = topo.host_link(name)
    config = NicConfig(
        ip=topo.nodes[name].ip,
        next_hop_mac=topo.mac_of(leaf.name, link),
        vni=link.vni,
        link_bps=link.rate_bps,
    )
    return NicCore(config, rng=random.Random(7))


def _qp(nic: NicCore, topo: Any, peer: str) -> tuple[QueuePair, int, int]:
    """A QP of ``nic`` in RTS towards ``peer``, with a memory region: (qp, rkey, address)."""
    pd, cq = nic.alloc_pd(), nic.create_cq()
    qp = nic.create_qp(pd, cq, cq)
    nic.modify_qp(qp, QPAttr(qp_state=QPState.INIT, port_num=1, qp_access_flags=_RW))
    rtr = QPAttr(
        qp_state=QPState.RTR,
        path_mtu=1024,
        dest_qp_num=0x11,
        rq_psn=0,
        max_dest_rd_atomic=4,
        min_rnr_timer=1,
        ah_attr=topo.nodes[peer].ip,
    )
    nic.modify_qp(qp, rtr)
    rts = QPAttr(
        qp_state=QPState.RTS, sq_psn=0, timeout=12, retry_cnt=7, rnr_retry=7, max_rd_atomic=4
    )
    nic.modify_qp(qp, rts)
    mr = nic.reg_mr(pd, np.zeros(1 << 16, dtype=np.uint8), _RW)
    return qp, mr.rkey, mr.addr


def _datagram(rng: random.Random, template: FrameTemplate, qpn: int, rkey: int, addr: int) -> bytes:
    """One datagram drawn from ``rng``."""
    kind = rng.randrange(6)
    opcode = rng.choice((0x04, 0x0A, 0x0C, 0x11, 0x81, 0x00, 0x06, rng.randrange(256)))
    dqpn = qpn if rng.random() < 0.8 else rng.getrandbits(24)
    psn = rng.randrange(4) if rng.random() < 0.7 else rng.getrandbits(24)
    if opcode in (0x0A, 0x0C, 0x06):
        ext = pack_reth(addr + rng.randrange(-64, 1 << 16), rkey, rng.randrange(0, 2048))
    elif opcode == 0x11:
        ext = pack_aeth(rng.getrandbits(8), rng.getrandbits(24))
    else:
        ext = b""
    frame = template.build(
        opcode,
        dqpn,
        psn,
        ackreq=rng.random() < 0.5,
        ext=ext,
        payload=rng.randbytes(rng.randrange(0, 1100)),
    )
    if kind == 0:
        return frame
    elif kind == 1:  # bytes flipped
        data = bytearray(frame)
        for _ in range(rng.randrange(1, 5)):
            data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
        return bytes(data)
    elif kind == 2:  # cut, or trailing bytes appended
        cut = rng.randrange(len(frame) + 8)
        return frame[:cut] + (rng.randbytes(rng.randrange(8)) if rng.random() < 0.3 else b"")
    elif kind == 3:  # a random IPv4 total length under a valid header checksum
        data = bytearray(frame)
        total = rng.choice((0, 1, 19, 20, 21, 28, rng.randrange(0, 1 << 16)))
        data[_IP + 2 : _IP + 4] = total.to_bytes(2, "big")
        data[_IP + 10 : _IP + 12] = b"\0\0"
        data[_IP + 10 : _IP + 12] = ipv4_checksum(data[_IP : _IP + 20]).to_bytes(2, "big")
        return bytes(data)
    elif kind == 4:  # a PFC frame, perhaps damaged
        quanta = {p: rng.getrandbits(16) for p in range(8) if rng.random() < 0.3}
        data = bytearray(
            encode_vxlan(rng.choice((1, 2, rng.getrandbits(24))), encode_pfc(b"\2" * 6, quanta))
        )
        if rng.random() < 0.5:
            data[rng.randrange(len(data))] = rng.getrandbits(8)
        return bytes(data[: rng.randrange(len(data) + 1)] if rng.random() < 0.3 else data)
    else:  # random bytes behind a VXLAN flag, or none
        return bytes((0x08,)) + rng.randbytes(rng.randrange(0, 120))


def fuzz(n: int, seed: int) -> dict[str, Any]:
    """Counters after N inputs to a switch and to a NIC; raises only if a core raised."""
    topo = parse(tomllib.loads(single_switch(2)), "fuzz.toml")
    switch = SwitchCore(topo.switch_config(topo.switches[0].name))
    h0, h1 = (h.name for h in topo.hosts)
    nic = _nic(topo, h1)
    qp, rkey, addr = _qp(nic, topo, h0)
    link, leaf = topo.host_link(h0)
    template = FrameTemplate(
        vni=link.vni,
        src_mac=topo.mac_of(leaf.name, link),
        dst_mac=topo.mac_of(leaf.name, link),
        src_ip=ip_to_int(topo.nodes[h0].ip),
        dst_ip=ip_to_int(topo.nodes[h1].ip),
        sport=0xC001,
    )
    rng = random.Random(seed)
    sent = {"switch": 0, "nic": 0}
    now = 0.0
    qps = 1
    for i in range(n):
        if qp.state is QPState.ERR:  # a fuzzed NAK or response ended it: fuzz a fresh one
            nic.destroy_qp(qp)
            qp, rkey, addr = _qp(nic, topo, h0)
            qps += 1
        datagram = _datagram(rng, template, qp.qpn, rkey, addr)
        now = i * 1e-6
        switch.receive(i % len(switch.ports), datagram, now)
        nic.receive_datagram(datagram, now)
        for core, name in ((switch, "switch"), (nic, "nic")):
            deadline = core.get_timer()
            if deadline is not None and deadline <= now:
                core.handle_timer(now)
            while core.next_out(now) is not None:
                sent[name] += 1
    ports = [
        {"rx": p.rx_packets, "rx_bytes": p.rx_bytes, "drops": dict(sorted(p.drops.items()))}
        for p in switch.ports
    ]
    c = nic.counters
    return {
        "build": cores.BUILD,
        "switch": {"ports": ports, "sent": sent["switch"]},
        "nic": {
            "rx": c.rx_packets,
            "rx_bytes": c.rx_bytes,
            "drops": dict(sorted(c.rx_drops.items())),
            "sent": sent["nic"],
            "qps": qps,
        },
    }


def main() -> int:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 20_000
    seed = int(sys.argv[2]) if len(sys.argv) > 2 else 1
    print(json.dumps(fuzz(n, seed), sort_keys=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
