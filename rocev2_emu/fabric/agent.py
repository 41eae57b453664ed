"""Jobs on a running fabric: every host runs an agent that executes flows and reports each
flow's completion time (FCT), as the HPCC simulator's flow files drive its hosts.

A flow is (id, src, dst, size, start, DSCP): at ``start`` (emulated seconds after the job's
start) the source RDMA-WRITEs ``size`` seeded bytes into a buffer the destination registered
for it, over a QP of its own; the FCT is from the first post to the last completion.  The
destination then reports a SHA-256 of what it received, so every byte is checked end to end.

The same :class:`HostAgent` serves both modes: in-process peers call each other directly
(virtual mode), and :mod:`rocev2_emu.fabric.agent_server`'s ``AgentServer`` and ``RemotePeer``
carry the same calls over TCP with msgpack between processes.
"""

from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass
from typing import Any, Final, Protocol

import numpy as np
import numpy.random  # loaded lazily by numpy otherwise: in the first flow's set-up
import trio

from rocev2_emu.runtime.clock import lateness_stats
from rocev2_emu.transport.errors import RemoteVerbsError
from rocev2_emu.transport.memory import Access
from rocev2_emu.transport.work import SendWR, Sge, WcStatus, WrOpcode
from rocev2_emu.verbs.api import CQ, MR, PD, QP, Context
from rocev2_emu.verbs.oob import QPInfo
from rocev2_emu.wire.roce import DSCP_ROCE

CONTROL_PORT = 18515
CHUNK = 64 << 10  # bytes per work request: completions come often enough to watch
MAX_FLOW_BYTES = 1 << 32  # a flow's buffer is allocated: 4 GiB, no more


@dataclass(slots=True, frozen=True)
class FlowSpec:
    id: int
    src: str
    dst: str
    size: int
    start: float = 0.0  # emulated seconds after the job starts
    dscp: int = DSCP_ROCE

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> FlowSpec:
        """A flow from a control request, each field checked (a bad one is a ValueError)."""
        spec = cls(
            int(d["id"]),
            str(d["src"]),
            str(d["dst"]),
            int(d["size"]),
            float(d.get("start", 0.0)),
            int(d.get("dscp", DSCP_ROCE)),
        )
        if not 0 <= spec.size <= MAX_FLOW_BYTES:
            raise ValueError(f"flow size {spec.size}: 0 to {MAX_FLOW_BYTES} bytes")
        if not 0 <= spec.dscp < 64:
            raise ValueError(f"flow dscp {spec.dscp}: 0 to 63")
        if not 0 <= spec.start < 1e6:
            raise ValueError(f"flow start {spec.start}: emulated seconds from 0")
        return spec


@dataclass(slots=True)
class FlowResult:
    id: int
    src: str
    dst: str
    size: int
    start: float  # emulated seconds, job clock
    fct: float  # emulated seconds; 0 when it failed
    status: str  # "ok" or the failure
    verified: bool | None  # the destination holds the bytes; None: not checked (timing only)

    @property
    def ok(self) -> bool:
        """It completed, and what arrived is right or was not checked (timing only)."""
        return self.status == "ok" and self.verified is not False


class FlowPeer(Protocol):
    async def accept_flow(self, spec: FlowSpec, sender: QPInfo) -> QPInfo: ...

    async def holds(self, flow_id: int, data: np.ndarray) -> bool:
        """Whether flow ``flow_id``'s destination holds exactly ``data`` (the flow ends
        there)."""
        ...


_BLOCK_WORDS: Final = 8192  # 64 KiB: a flow's bytes are blocks of one random block, each keyed
_MASK64: Final = (1 << 64) - 1


@functools.cache
def _random_block() -> np.ndarray:
    return np.random.PCG64(0).random_raw(_BLOCK_WORDS)


def _splitmix(x: np.ndarray) -> np.ndarray:
    """SplitMix64's output function on each 64-bit word (numpy's uint64 arithmetic wraps)."""
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    out: np.ndarray = x ^ (x >> np.uint64(31))
    return out


def flow_data(spec: FlowSpec) -> np.ndarray:
    """The bytes flow ``spec`` writes, fixed by its id: each 64 KiB block is one random block
    (PCG64's words) XOR a 64-bit key that SplitMix64 draws from (id, block), so no two blocks
    of any flows are alike and a misplaced block is caught.  A sixth of the time a PCG64
    seeded per flow takes (1 023 flows of 64 KiB: 11 ms against 68 ms; ids and blocks below
    2**32, the keys are distinct: both steps are bijections)."""
    words = -(-spec.size // 8)
    blocks = -(-words // _BLOCK_WORDS)
    first = np.uint64((spec.id << 32) & _MASK64)
    keys = _splitmix((np.arange(blocks, dtype=np.uint64) + first) * np.uint64(0x9E3779B97F4A7C15))
    block = _random_block()[: min(words, _BLOCK_WORDS)]
    data = (block[None, :] ^ keys[:, None]).reshape(-1)[:words]
    out: np.ndarray = data.astype("<u8", copy=False).view(np.uint8)[: spec.size]
    return out


def data_digest(data: np.ndarray) -> str:
    """What a flow's check compares: the SHA-256 (hex) of the bytes its source wrote
    (:func:`flow_data`) or its destination holds."""
    return hashlib.sha256(data.tobytes()).hexdigest()


class HostAgent:
    def __init__(
        self, ctx: Context, name: str, *, mtu: int = 4096, qp_timeout: int = 14, retry_cnt: int = 7
    ) -> None:
        self.ctx = ctx
        self.name = name
        self.mtu = mtu
        self.qp_timeout = qp_timeout
        self.retry_cnt = retry_cnt
        self.pd = PD(ctx)
        self._inbound: dict[int, tuple[QP, MR, np.ndarray]] = {}
        self._outbound: dict[int, _OpenFlow] = {}

    def _connect(self, qp: QP, peer: QPInfo, dscp: int) -> None:
        qp.connect(
            peer.remote(),
            path_mtu=self.mtu,
            timeout=self.qp_timeout,
            retry_cnt=self.retry_cnt,
            traffic_class=dscp,
        )

    async def accept_flow(self, spec: FlowSpec, sender: QPInfo) -> QPInfo:
        """Destination side: a buffer and a QP for one inbound flow."""
        buf = np.zeros(max(1, spec.size), dtype=np.uint8)
        mr = MR(self.pd, buf, Access.LOCAL_WRITE | Access.REMOTE_WRITE)
        qp = QP(self.pd, CQ(self.ctx, 16))
        self._connect(qp, sender, spec.dscp)
        self._inbound[spec.id] = (qp, mr, buf)
        return QPInfo.of(qp, mr)

    def received_bytes(self, flow_id: int) -> int | None:
        """Bytes of inbound flow ``flow_id`` written into this host so far (None: not open)."""
        inbound = self._inbound.get(flow_id)
        return None if inbound is None else inbound[0].rx_bytes

    async def digest(self, flow_id: int) -> str:
        return data_digest(self._inbound.pop(flow_id)[2])

    async def holds(self, flow_id: int, data: np.ndarray) -> bool:
        """In this process: the bytes compared as they are, no digest of either."""
        return bool(np.array_equal(self._inbound.pop(flow_id)[2], data))

    def digests(self, flow_ids: list[int]) -> list[str | None]:
        """The SHA-256 of what each inbound flow wrote here (None: no such flow arrived)."""
        return [
            data_digest(self._inbound.pop(i)[2]) if i in self._inbound else None for i in flow_ids
        ]

    async def open_flow(self, spec: FlowSpec, peer: FlowPeer) -> None:
        """Source side, before the job's clock starts: the flow's buffer and QP, the
        destination's (``peer.accept_flow``), and the connection.  Flows are opened one at a
        time in the job's order, so each NIC draws its QPNs and PSNs in the same order however
        the fabric runs (one process in virtual time, or one per node)."""
        # (timing only: the frames carry no bytes, so the buffer is never read - its pages
        # are never touched)
        data = np.empty(spec.size, np.uint8) if self.ctx.core.elide else flow_data(spec)
        mr = MR(self.pd, data if spec.size else np.zeros(1, np.uint8), Access.LOCAL_WRITE)
        chunks = max(1, -(-spec.size // CHUNK))
        cq = CQ(self.ctx, chunks + 16)
        qp = QP(self.pd, cq, max_send_wr=chunks + 16)
        remote = await peer.accept_flow(spec, QPInfo.of(qp))
        self._connect(qp, remote, spec.dscp)
        self._outbound[spec.id] = _OpenFlow(spec, peer, data, mr, cq, qp, remote)

    async def run_flow(self, flow_id: int, t0: float, verify: bool = True) -> FlowResult:
        """Source side: wait for the start time, write, close the QP, verify (``verify``
        False: the job checks what arrived itself, :meth:`digests`, and ``verified`` stays
        False here; a timing-only NIC's flows are not checked: None)."""
        flow = self._outbound.pop(flow_id)
        spec, mr, cq, qp, remote = flow.spec, flow.mr, flow.cq, flow.qp, flow.remote
        chunks = max(1, -(-spec.size // CHUNK))
        await trio.sleep_until(self.ctx.clock.to_trio(t0 + spec.start))
        begin = self.ctx.now()
        qp.post_send(
            [
                SendWR(
                    k,
                    WrOpcode.RDMA_WRITE,
                    [Sge(mr.addr + k * CHUNK, min(CHUNK, spec.size - k * CHUNK), mr.lkey)],
                    remote_addr=remote.vaddr + k * CHUNK,
                    rkey=remote.rkey,
                )
                for k in range(chunks)
            ]
        )
        status = "ok"
        # the transport completes every request or fails it after its retries; this deadline
        # only guards against a hang, so it is generous: no progress for that long is an error
        deadline = 4.096e-6 * 2**self.qp_timeout * (self.retry_cnt + 2) * 4 + CHUNK * 8 / 1e9
        done = 0
        try:
            while done < chunks:
                for wc in await cq.wait(chunks, timeout=deadline):
                    if wc.status is not WcStatus.SUCCESS:
                        raise RemoteVerbsError(f"completion {wc.status.name}")
                    done += 1
        except RemoteVerbsError as exc:
            status = str(exc)
        fct = self.ctx.now() - begin if status == "ok" else 0.0
        qp.close()  # at the instant the flow ended, before any out-of-band wait
        verified: bool | None = False
        if status == "ok" and self.ctx.core.elide:
            verified = None  # timing only: the fabric carried no bytes to check
        elif status == "ok" and verify:
            verified = await flow.peer.holds(spec.id, flow.data)
        return FlowResult(spec.id, spec.src, spec.dst, spec.size, spec.start, fct, status, verified)

    async def run_open_flows(self, t0: float, verify: bool = True) -> list[FlowResult]:
        """Every flow opened here, concurrently (one task each, in the order opened)."""
        results: list[FlowResult] = []

        async def one(flow_id: int) -> None:
            results.append(await self.run_flow(flow_id, t0, verify))

        async with trio.open_nursery() as nursery:
            for flow_id in list(self._outbound):
                nursery.start_soon(one, flow_id)
        return sorted(results, key=lambda r: r.id)

    async def run_flows(
        self, specs: list[FlowSpec], peers: dict[str, FlowPeer], t0: float
    ) -> list[FlowResult]:
        """Open ``specs`` one by one, then run them: a job of this host alone."""
        for spec in specs:
            await self.open_flow(spec, peers[spec.dst])
        return await self.run_open_flows(t0)


@dataclass(slots=True)
class _OpenFlow:
    """A flow opened at its source and not yet run."""

    spec: FlowSpec
    peer: FlowPeer
    data: np.ndarray
    mr: MR
    cq: CQ
    qp: QP
    remote: QPInfo


def host_map_state(ctx: Context, now: float | None = None) -> dict[str, Any]:
    """A host's part of the live map: its counters and each rate-controlled QP's current rate
    (DCQCN's, bit/s), by QPN as the NIC's metrics name them; at emulated ``now`` (given: the
    instant a virtual run's observer sees, which the clock may not show yet)."""
    now = ctx.now() if now is None else now
    rates = {}
    for qp in list(ctx.core.qps.values()):
        rate = getattr(qp.rc, "rate", None)  # DCQCN's current rate; static pacing has none
        if isinstance(rate, int | float):
            rates[f"0x{qp.qpn:06x}"] = float(rate)
    return {**host_stats(ctx, now), "qp_rates": rates, "now": now}


def host_stats(ctx: Context, now: float | None = None) -> dict[str, Any]:
    """A host NIC's share of the fabric summary (XOFF in force at ``now``, default the clock's)."""
    now = ctx.now() if now is None else now
    c = ctx.core.counters
    return {
        "nic_pauses": sum(ctx.core.pause_frames_received),
        "nic_tx_bytes": c.tx_bytes,
        "nic_paused": any(until > now for until in ctx.core.paused_until),  # XOFF in force
        "cnps_sent": c.np_cnp_sent,
        "cnps_handled": c.rp_cnp_handled,
        "retransmitted": c.retransmitted_packets,
        "timeouts": c.local_ack_timeout_err,
        "nic_drops": sum(c.rx_drops.values()),
        "socket_drops": ctx.port.kernel_drops(),
        **lateness_stats(ctx.driver),
    }
