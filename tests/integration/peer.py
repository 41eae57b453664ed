"""A passive RDMA peer in its own process, for the multi-process integration tests.

It opens a NIC on a real UDP port, registers a buffer filled with a seeded pattern, accepts one
out-of-band connection, connects its QP, keeps receives posted over the whole buffer (for SEND
tests), and answers commands: ``digest`` (SHA-256 of the buffer, so the test can check data
byte-exact without trusting the transport it is testing) and ``exit``.

    python -m tests.integration.peer --nic-addr 127.0.0.21 --oob-port 18600 --size 4194304
"""

from __future__ import annotations

import argparse
import hashlib

import numpy as np
import trio

from rocev2_emu.runtime.link import LinkFaults
from rocev2_emu.transport.memory import Access
from rocev2_emu.transport.work import RecvWR, Sge
from rocev2_emu.verbs.api import CQ, MR, PD, QP, Context, DeviceConfig
from rocev2_emu.verbs.oob import OobChannel, connect_qp

RECV_CHUNK = 64 << 10


def seeded(size: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, size, dtype=np.uint8)


async def main(args: argparse.Namespace) -> None:
    faults = LinkFaults(
        loss=args.loss, duplicate=args.duplicate, reorder=args.reorder, seed=args.seed + 1
    )
    config = DeviceConfig(bind=args.nic_addr, link_gbps=0, tdf=1.0, faults=faults)
    async with Context.open(config) as ctx:
        buf = seeded(args.size, args.seed)
        pd = PD(ctx)
        mr = MR(pd, buf, Access.LOCAL_WRITE | Access.REMOTE_WRITE | Access.REMOTE_READ)
        cq = CQ(ctx, 1 << 16)
        qp = QP(pd, cq, max_recv_wr=4096)
        chan = await OobChannel.accept("127.0.0.1", args.oob_port, timeout=60)
        await connect_qp(chan, qp, mr, path_mtu=args.mtu, timeout=args.qp_timeout)
        qp.post_recv(
            [
                RecvWR(k, [Sge(mr.addr + off, min(RECV_CHUNK, args.size - off), mr.lkey)])
                for k, off in enumerate(range(0, args.size, RECV_CHUNK))
            ]
        )
        await chan.send({"ready": True})
        while True:
            msg = await chan.recv()
            if msg.get("cmd") == "digest":
                await chan.send(
                    {
                        "sha256": hashlib.sha256(buf.tobytes()).hexdigest(),
                        "received": len(cq.poll(1 << 16)),
                    }
                )
            elif msg.get("cmd") == "exit":
                await chan.send({"bye": True})
                return


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--nic-addr", required=True)
    p.add_argument("--oob-port", type=int, required=True)
    p.add_argument("--size", type=int, default=4 << 20)
    p.add_argument("--seed", type=int, default=5)
    p.add_argument("--mtu", type=int, default=1024)
    p.add_argument("--qp-timeout", type=int, default=14)
    p.add_argument("--loss", type=float, default=0.0)
    p.add_argument("--duplicate", type=float, default=0.0)
    p.add_argument("--reorder", type=float, default=0.0)
    trio.run(main, p.parse_args())
