"""The verbs-like async API, shaped after pyverbs: Context, PD, MR, CQ, QP.

A :class:`Context` is an open software NIC: the sans-IO :class:`~rocev2_emu.nic.NicCore`, its
UDP (or in-memory) port, and the trio driver task that pumps it, all owned by the context's
nursery; or, in virtual time, a node of the fabric's event engine
(:mod:`rocev2_emu.runtime.engine`), which carries its frames with no task of its own.  Every
verbs call is synchronous and cheap, as in libibverbs; only completion polling
awaits, and always with a deadline (emulated seconds)::

    async with Context.open(DeviceConfig(bind="127.0.0.2")) as ctx:
        pd = PD(ctx)
        mr = MR(pd, buffer, Access.LOCAL_WRITE | Access.REMOTE_WRITE)
        cq = CQ(ctx, 256)
        qp = QP(pd, cq)
        ...  # exchange QPN/PSN/GID/rkey out of band (rocev2_emu.verbs.oob), then qp.connect(...)
        qp.post_send(SendWR(...))
        wcs = await cq.wait(timeout=1.0)
"""

from __future__ import annotations

import ipaddress
import random
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import trio

from rocev2_emu.cc import (
    PROFILES,
    DcqcnFactory,
    DcqcnParams,
    LineRateFactory,
    RateControlFactory,
    StaticRateFactory,
)
from rocev2_emu.nic.config import NicConfig
from rocev2_emu.nic.core import NicCore
from rocev2_emu.nic.driver import EngineNic, NicDriver
from rocev2_emu.nic.ingress import IngressConfig
from rocev2_emu.runtime.clock import DilatedClock
from rocev2_emu.runtime.engine import Engine
from rocev2_emu.runtime.link import LinkFaults
from rocev2_emu.runtime.ports import DatagramPort, EnginePort, PortInfo, UdpPort
from rocev2_emu.runtime.pump import CATCHUP_WALL_SECONDS
from rocev2_emu.transport.errors import LocalVerbsError, RemoteVerbsError
from rocev2_emu.transport.memory import Access, MemoryRegion
from rocev2_emu.transport.qp import DEFAULT_MAX_INFLIGHT, QueuePair
from rocev2_emu.transport.qp_state import QPAttr, QPState
from rocev2_emu.transport.work import CompletionQueue, RecvWR, SendWR, WorkCompletion
from rocev2_emu.verbs.doorbell import Doorbell
from rocev2_emu.wire.ethernet import LINK_UDP_PORT, ip_to_int
from rocev2_emu.wire.pcap import PcapWriter

__all__ = ["CQ", "MR", "PD", "QP", "Context", "DeviceConfig", "RemoteQP"]


def default_gid(bind: str) -> str:
    """The emulated IPv4 of a NIC bound to 127.a.b.c: 10.a.b.c."""
    packed = ipaddress.IPv4Address(bind).packed
    return str(ipaddress.IPv4Address(b"\x0a" + packed[1:]))


@dataclass(slots=True)
class DeviceConfig:
    """How to open a software NIC."""

    bind: str = "127.0.0.2"  # UDP address of the NIC's port (its node address)
    port: int = LINK_UDP_PORT
    gid: str | None = None  # emulated IPv4; default 10.x.y.z from the bind address
    link_peer: tuple[str, int] | None = None  # where the link leads; None: learn it later
    link_gbps: float = 100.0  # emulated line rate, 0 = unpaced
    tdf: float = 1.0
    faults: LinkFaults = field(default_factory=LinkFaults)
    pcap: str | None = None
    next_hop_mac: bytes | None = None
    vni: int = 1
    epoch: float | None = None  # time.monotonic() at emulated time 0, shared by a fabric
    seed: int | None = None  # seeds QPNs, PSNs and keys (virtual mode); None: a CSPRNG
    ingress: IngressConfig | None = None  # a slow host that pauses its switch port (PFC)
    dcqcn: DcqcnParams | None = None  # DCQCN at this NIC (notification and reaction); None: off
    max_inflight: int = DEFAULT_MAX_INFLIGHT  # per-QP cap on unacknowledged packets
    pacing_gbps: float = 0.0  # every QP paced at this rate (when DCQCN is off); 0: line rate
    batch_io: bool = True  # UDP GSO/GRO where the kernel has them (runtime/ports.py)
    timing_only: bool = False  # frames carry their headers only (a timing-only run)


def rate_control(config: DeviceConfig) -> RateControlFactory:
    """The NIC's rate control, resolved once: DCQCN if the device has it, else pacing at
    ``pacing_gbps`` if given, else none (line rate)."""
    if config.dcqcn is not None:
        return DcqcnFactory(config.dcqcn)
    if config.pacing_gbps:
        return StaticRateFactory(config.pacing_gbps * 1e9)
    return LineRateFactory()


@dataclass(slots=True, frozen=True)
class RemoteQP:
    """What the peer tells us out of band to connect to its QP (as perftest exchanges)."""

    qpn: int
    psn: int
    gid: str
    udp: tuple[str, int] | None = None


class Context:
    """An open NIC.  Use :meth:`open`; everything lives until the ``async with`` ends."""

    def __init__(
        self, core: NicCore, driver: NicDriver | EngineNic, clock: DilatedClock, port: PortInfo
    ) -> None:
        self.core = core
        self.driver = driver
        self.clock = clock
        self.port = port

    @classmethod
    @asynccontextmanager
    async def open(
        cls,
        config: DeviceConfig,
        *,
        port: DatagramPort | None = None,
        engine: Engine | None = None,
    ) -> AsyncIterator[Context]:
        """``port``: the datagram port to pump (default: a UDP socket on ``config.bind``);
        ``engine``: instead, a node of this virtual-time engine (the caller connects it)."""
        clock = DilatedClock(config.tdf, epoch=config.epoch)
        gid = config.gid or default_gid(config.bind)
        core = NicCore(
            NicConfig(
                ip=gid,
                next_hop_mac=config.next_hop_mac,
                vni=config.vni,
                link_bps=config.link_gbps * 1e9,
                # a late pump may send "in the past"; the virtual-time engine is never late
                catchup=0.0 if engine is not None else CATCHUP_WALL_SECONDS / config.tdf,
                ingress=config.ingress,
                rate_control=rate_control(config),
                send_cnps=config.dcqcn is not None,
                cnp_interval=(config.dcqcn or PROFILES["paper"]).cnp_interval,
                max_inflight=config.max_inflight,
                timing_only=config.timing_only,
            ),
            rng=None if config.seed is None else random.Random(config.seed),
        )
        if engine is not None:
            info = EnginePort((config.bind, config.port), config.link_peer)
            yield cls(core, EngineNic(core, engine, clock, info), clock, info)
            return
        if port is None:
            port = UdpPort((config.bind, config.port), config.link_peer, batch=config.batch_io)
        pcap = PcapWriter(config.pcap) if config.pcap else None
        driver = NicDriver(core, port, clock, faults=config.faults, pcap=pcap)
        ctx = cls(core, driver, clock, port)
        try:
            async with trio.open_nursery() as nursery:
                await nursery.start(driver.run)
                try:
                    yield ctx
                finally:
                    nursery.cancel_scope.cancel()
        except BaseExceptionGroup as group:
            raise _sole(group) from None
        finally:
            port.close()
            if pcap is not None:
                pcap.close()

    @property
    def gid(self) -> str:
        return self.core.config.ip

    @property
    def engine(self) -> Engine | None:
        """The event engine this NIC is a node of (virtual and exact runs), else None."""
        driver = self.driver
        return driver.engine if isinstance(driver, EngineNic) else None

    @property
    def udp_address(self) -> tuple[str, int]:
        return self.port.address

    def set_link_peer(self, peer: tuple[str, int]) -> None:
        """Point a direct link at the peer NIC's UDP address (learned out of band)."""
        self.port.peer = peer

    def now(self) -> float:
        """Emulated seconds since the context opened."""
        return self.clock.now()

    async def sleep(self, emulated_seconds: float) -> None:
        await trio.sleep(self.clock.wall_duration(emulated_seconds))


def _sole(group: BaseExceptionGroup[BaseException]) -> BaseException:
    """The one error inside (nested) single-member groups, so callers see what happened."""
    exc: BaseException = group
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


class PD:
    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.pd = ctx.core.alloc_pd()


class MR:
    """A registered buffer; ``addr``, ``lkey`` and ``rkey`` as ibv_mr."""

    def __init__(self, pd: PD, buffer: Any, access: Access) -> None:
        self.pd = pd
        self.mr: MemoryRegion = pd.ctx.core.reg_mr(pd.pd, buffer, access)

    @property
    def addr(self) -> int:
        return self.mr.addr

    @property
    def length(self) -> int:
        return self.mr.length

    @property
    def lkey(self) -> int:
        return self.mr.lkey

    @property
    def rkey(self) -> int:
        return self.mr.rkey

    def close(self) -> None:
        """Deregister: the keys stop working at once (remote access gets NAKed)."""
        self.pd.ctx.core.dereg_mr(self.mr)


class CQ:
    def __init__(self, ctx: Context, cqe: int = 4096) -> None:
        self.ctx = ctx
        self.cq: CompletionQueue = ctx.core.create_cq(cqe)

    def poll(self, num_entries: int = 1) -> list[WorkCompletion]:
        return self.cq.poll(num_entries)

    async def wait(self, num_entries: int = 1, *, timeout: float) -> list[WorkCompletion]:
        """At least one completion (up to ``num_entries``) within ``timeout`` emulated seconds.

        Raises :class:`RemoteVerbsError` when the deadline passes with nothing completed.
        """
        wcs = self.cq.poll(num_entries)
        if wcs:
            return wcs  # no deadline to set up
        with trio.move_on_after(self.ctx.clock.wall_duration(timeout)):
            return await self.next_completions(num_entries)
        raise RemoteVerbsError(
            f"no completion on CQ {self.cq.handle} within {timeout * 1e6:.0f} µs (emulated)"
        )

    async def next_completions(self, num_entries: int = 1) -> list[WorkCompletion]:
        """At least one completion (up to ``num_entries``), however long it takes: for a task
        that polls a CQ for the CQ's whole life and is cancelled with it, whose callers keep
        deadlines of their own.  :meth:`wait`'s deadline costs a cancel scope per call (a tenth
        of ``bench virtual --cases b`` when the collectives polled that way)."""
        lot = self.ctx.driver.cq_lot(self.cq.handle)
        while True:
            wcs = self.cq.poll(num_entries)
            if wcs:
                return wcs
            await lot.park()

    def set_handler(self, handler: Callable[[], bool] | None, *, reads_clock: bool = True) -> None:
        """``handler()`` runs in the NIC's driver each time this CQ gains completions, at the
        emulated instant they are made and before any task runs again (``None`` removes
        it): it polls and dispatches without a task switch per completion.  It must neither
        block nor raise, and returns whether it woke a task.  ``reads_clock=False`` promises
        it never reads the emulated clock: an event engine then skips bringing trio's clock to
        the instant before it runs."""
        self.ctx.driver.waiters.set_handler(self.cq.handle, handler, reads_clock)


class QP:
    """An RC queue pair."""

    def __init__(
        self,
        pd: PD,
        send_cq: CQ,
        recv_cq: CQ | None = None,
        *,
        max_send_wr: int = 1024,
        max_recv_wr: int = 1024,
        sq_sig_all: bool = False,
    ) -> None:
        self.ctx = pd.ctx
        self.qp: QueuePair = self.ctx.core.create_qp(
            pd.pd,
            send_cq.cq,
            (recv_cq or send_cq).cq,
            max_send_wr=max_send_wr,
            max_recv_wr=max_recv_wr,
            sq_sig_all=sq_sig_all,
        )
        self.psn = self.ctx.core.random_psn()
        self.doorbell = Doorbell(self.ctx.core, self.qp, self.ctx.driver.kicker())

    @property
    def qp_num(self) -> int:
        return self.qp.qpn

    @property
    def state(self) -> QPState:
        return self.qp.state

    @property
    def rx_bytes(self) -> int:
        """Payload bytes this QP has accepted as responder (SEND and WRITE data placed)."""
        return self.qp.responder.rx_bytes

    def modify(self, attr: QPAttr) -> None:
        self.ctx.core.modify_qp(self.qp, attr)
        self.ctx.driver.kick()

    def connect(
        self,
        remote: RemoteQP,
        *,
        access: Access = Access.LOCAL_WRITE
        | Access.REMOTE_WRITE
        | Access.REMOTE_READ
        | Access.REMOTE_ATOMIC,
        path_mtu: int = 4096,
        timeout: int = 14,
        retry_cnt: int = 7,
        rnr_retry: int = 7,
        min_rnr_timer: int = 12,
        max_rd_atomic: int = 16,
        traffic_class: int | None = None,
    ) -> None:
        """RESET -> INIT -> RTR -> RTS towards ``remote``, with perftest's usual attributes;
        ``traffic_class`` is the DSCP of the QP's packets (the NIC's default when None)."""
        try:
            ip_to_int(remote.gid)  # the IPv4Address check, remembered per address
        except ValueError as exc:
            raise LocalVerbsError(f"remote GID {remote.gid!r}: not an IPv4 address") from exc
        self.modify(QPAttr(qp_state=QPState.INIT, port_num=1, pkey_index=0, qp_access_flags=access))
        self.modify(
            QPAttr(
                qp_state=QPState.RTR,
                path_mtu=path_mtu,
                dest_qp_num=remote.qpn,
                rq_psn=remote.psn,
                max_dest_rd_atomic=max_rd_atomic,
                min_rnr_timer=min_rnr_timer,
                ah_attr=remote.gid,
                traffic_class=traffic_class,
            )
        )
        self.modify(
            QPAttr(
                qp_state=QPState.RTS,
                sq_psn=self.psn,
                timeout=timeout,
                retry_cnt=retry_cnt,
                rnr_retry=rnr_retry,
                max_rd_atomic=max_rd_atomic,
            )
        )
        if remote.udp is not None and self.ctx.port.peer is None:
            self.ctx.set_link_peer(remote.udp)

    def post_send(self, wrs: SendWR | Sequence[SendWR]) -> None:
        if isinstance(wrs, SendWR):
            self.doorbell.post_send(wrs)
        else:
            self.doorbell.post_sends(wrs)

    def post_recv(self, wrs: RecvWR | Sequence[RecvWR]) -> None:
        if isinstance(wrs, RecvWR):
            self.doorbell.post_recv(wrs)
        else:
            self.doorbell.post_recvs(wrs)

    def close(self) -> None:
        if self.qp.state is not QPState.RESET:
            self.ctx.core.modify_qp(self.qp, QPAttr(qp_state=QPState.ERR))
        self.ctx.core.destroy_qp(self.qp)
