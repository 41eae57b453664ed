"""Out-of-band connection set-up: msgpack over TCP, as perftest and rdma_cm exchange QP data.

Before two RC QPs can talk, each side must learn the other's QPN, starting PSN, GID (the
emulated IPv4), the UDP address of its NIC, and - for RDMA - an rkey, address and length.  An
:class:`OobChannel` carries :mod:`rocev2_emu.control.channel`'s length-prefixed msgpack maps
over one TCP connection and raises :class:`OobError`, a :class:`RemoteVerbsError`.
:meth:`OobChannel.exchange` swaps two :class:`QPInfo` lists; :func:`connect_qp` does that for one
QP and brings it to RTS; :func:`serve_requests` answers requests on such a connection, and
:func:`fabric_secret` is the secret a fabric's control servers demand
(:mod:`rocev2_emu.control.auth`).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any, Final

import trio

from rocev2_emu.control.auth import ENV as FABRIC_SECRET_ENV
from rocev2_emu.control.auth import current as fabric_secret
from rocev2_emu.control.channel import (
    ControlError,
    MessageChannel,
    connection_limit,
    open_channel,
    serve_requests,
)
from rocev2_emu.transport.errors import RemoteVerbsError
from rocev2_emu.verbs.api import MR, QP, RemoteQP

DEFAULT_OOB_PORT: Final = 18515  # perftest's default
_FIELD_BITS: Final = {"qpn": 24, "psn": 24, "rkey": 32, "vaddr": 64, "length": 64}

__all__ = [
    "DEFAULT_OOB_PORT",
    "FABRIC_SECRET_ENV",
    "OobChannel",
    "OobError",
    "QPInfo",
    "connect_qp",
    "connection_limit",
    "fabric_secret",
    "serve_requests",
]


@dataclass(slots=True, frozen=True)
class QPInfo:
    """One QP's connection data, as perftest prints it (QPN, PSN, RKey, VAddr, GID)."""

    qpn: int
    psn: int
    gid: str
    udp_host: str
    udp_port: int
    rkey: int = 0
    vaddr: int = 0
    length: int = 0

    @classmethod
    def of(cls, qp: QP, mr: MR | None = None) -> QPInfo:
        """What a peer needs of ``qp`` (and of ``mr``: rkey, address, length)."""
        ctx = qp.ctx
        host, port = ctx.udp_address
        if mr is None:
            return cls(qp.qp_num, qp.psn, ctx.gid, host, port)
        return cls(qp.qp_num, qp.psn, ctx.gid, host, port, mr.rkey, mr.addr, mr.length)

    def row(self) -> list[Any]:
        """The fields in order; ``QPInfo(*row)`` makes it again.  A compact store value: a job
        keeps one per QP it connects."""
        return [
            self.qpn,
            self.psn,
            self.gid,
            self.udp_host,
            self.udp_port,
            self.rkey,
            self.vaddr,
            self.length,
        ]

    def remote(self) -> RemoteQP:
        return RemoteQP(self.qpn, self.psn, self.gid, (self.udp_host, self.udp_port))

    @classmethod
    def from_wire(cls, obj: Any) -> QPInfo:
        """A peer's QP description, every field checked: a QPN and PSN of 24 bits, a GID that is
        an IPv4 address (RoCEv2's IPv4-mapped GID), a UDP port, 32-bit keys, 64-bit addresses."""
        try:
            info = cls(**obj)
        except TypeError as exc:
            raise OobError(f"out-of-band peer sent a bad QP description {obj!r:.200}") from exc
        for name, bits in _FIELD_BITS.items():
            value = getattr(info, name)
            if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < 1 << bits:
                raise OobError(f"out-of-band peer sent {name} = {value!r:.80}: not {bits} bits")
        if not 0 < info.udp_port < 65536:
            raise OobError(f"out-of-band peer sent udp_port = {info.udp_port}: not a port")
        for name in ("gid", "udp_host"):
            value = getattr(info, name)
            if not isinstance(value, str) or len(value) > 255:
                raise OobError(f"out-of-band peer sent {name} = {value!r:.80}: not an address")
        try:
            ipaddress.IPv4Address(info.gid)
        except ValueError as exc:
            raise OobError(f"out-of-band peer sent gid = {info.gid!r:.80}: not IPv4") from exc
        return info


class OobError(RemoteVerbsError, ControlError):
    """An out-of-band exchange failed: a verbs-level remote error and a control error."""


class PeerExchange:
    """The out-of-band conversation of two verbs users over any ``send``/``recv`` of msgpack
    values: swapping QP descriptions, barriers (:class:`OobChannel` over TCP; an emulated run's
    channel over its rendezvous store, :class:`~rocev2_emu.fabric.rendezvous.StoreChannel`)."""

    async def send(self, obj: Any) -> None:
        raise NotImplementedError

    async def recv(self) -> Any:
        raise NotImplementedError

    async def exchange(
        self, local: list[QPInfo], extra: dict[str, Any] | None = None
    ) -> tuple[list[QPInfo], dict[str, Any]]:
        """Swap QP descriptions (and free-form parameters) with the peer."""
        await self.send({"qps": [asdict(q) for q in local], "extra": extra or {}})
        msg = await self.recv()
        if isinstance(msg, dict) and "error" in msg:
            raise OobError(f"out-of-band peer refused: {msg['error']}")
        if not isinstance(msg, dict) or not isinstance(msg.get("qps"), list):
            raise RemoteVerbsError(f"out-of-band peer sent {msg!r}, not a QP exchange")
        return [QPInfo.from_wire(q) for q in msg["qps"]], dict(msg.get("extra") or {})

    async def barrier(self, tag: str) -> None:
        await self.send({"barrier": tag})
        msg = await self.recv()
        if msg != {"barrier": tag}:
            raise RemoteVerbsError(f"out-of-band barrier {tag!r}: peer sent {msg!r}")


class OobChannel(MessageChannel, PeerExchange):
    """A TCP stream carrying length-prefixed msgpack messages between two verbs users."""

    error = OobError
    what = "out-of-band"

    @classmethod
    async def connect(
        cls,
        host: str,
        port: int = DEFAULT_OOB_PORT,
        *,
        timeout: float = 10.0,
        wait_for_listener: bool = True,
        secret: bytes | None = None,
    ) -> OobChannel:
        """Connect to a peer, retrying until ``timeout`` (wall seconds) while nothing listens
        (``wait_for_listener=False``: a refused connection fails at once, as perftest does);
        with ``secret``, prove it to a server that demands it (the fabric's control plane)."""
        chan = await open_channel(
            host,
            port,
            timeout=timeout,
            channel=cls,
            wait_for_listener=wait_for_listener,
            secret=secret,
        )
        assert isinstance(chan, OobChannel)
        return chan

    @classmethod
    async def accept(
        cls,
        host: str,
        port: int = DEFAULT_OOB_PORT,
        *,
        timeout: float = 60.0,
        listening: Callable[[], None] | None = None,
    ) -> OobChannel:
        """Listen on ``host:port`` and accept exactly one peer within ``timeout`` seconds;
        ``listening()`` is called once the port is open (perftest's "Waiting for client")."""
        listeners = await trio.open_tcp_listeners(port, host=host)
        if listening is not None:
            listening()
        try:
            with trio.move_on_after(timeout):
                stream = await listeners[0].accept()
                return cls(stream, timeout)
        finally:
            for listener in listeners:
                await listener.aclose()
        raise OobError(f"no out-of-band peer connected to {host}:{port} within {timeout:g} s")


async def connect_qp(chan: OobChannel, qp: QP, mr: MR | None = None, **attrs: Any) -> QPInfo:
    """Swap QP data (and ``mr``'s rkey, address and length) with the peer over ``chan`` and
    bring ``qp`` to RTS towards it; ``attrs`` go to :meth:`QP.connect`.  Returns the peer's."""
    remote, _ = await chan.exchange([QPInfo.of(qp, mr)])
    if len(remote) != 1:
        raise RemoteVerbsError(f"out-of-band peer described {len(remote)} QPs, expected 1")
    qp.connect(remote[0].remote(), **attrs)
    return remote[0]
