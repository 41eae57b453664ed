"""Out-of-band connection set-up: msgpack over TCP, as perftest and rdma_cm exchange QP data.

Before two RC QPs can talk, each side must learn the other's QPN, starting PSN, GID (the
emulated IPv4), the UDP address of its NIC, and - for RDMA - an rkey, address and length.  An
:class:`OobChannel` carries length-prefixed msgpack maps over one TCP connection; every receive
has a deadline and every malformed message is a clear error.  :meth:`OobChannel.exchange` swaps
two :class:`QPInfo` lists; :func:`connect_qp` does that for one QP and brings it to RTS.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from typing import Any, Final

import msgpack
import trio

from rocev2_emu.errors import RemoteVerbsError
from rocev2_emu.verbs import MR, QP, RemoteQP

DEFAULT_OOB_PORT: Final = 18515  # perftest's default
_LEN: Final = struct.Struct("!I")
MAX_MESSAGE: Final = 1 << 20


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

    def remote(self) -> RemoteQP:
        return RemoteQP(self.qpn, self.psn, self.gid, (self.udp_host, self.udp_port))

    @classmethod
    def from_wire(cls, obj: Any) -> QPInfo:
        try:
            return cls(**obj)
        except TypeError as exc:
            raise RemoteVerbsError(f"out-of-band peer sent a bad QP description {obj!r}") from exc


class OobChannel:
    """A TCP stream carrying length-prefixed msgpack messages."""

    def __init__(self, stream: trio.SocketStream, timeout: float) -> None:
        self.stream = stream
        self.timeout = timeout
        self._buf = bytearray()

    @classmethod
    async def connect(
        cls, host: str, port: int = DEFAULT_OOB_PORT, *, timeout: float = 10.0
    ) -> OobChannel:
        """Connect to a listening peer, retrying until ``timeout`` (wall seconds)."""
        with trio.move_on_after(timeout):
            while True:
                try:
                    stream = await trio.open_tcp_stream(host, port)
                except OSError:
                    await trio.sleep(0.05)
                    continue
                return cls(stream, timeout)
        raise RemoteVerbsError(
            f"no out-of-band peer listening on {host}:{port} within {timeout:g} s"
        )

    @classmethod
    async def accept(
        cls, host: str, port: int = DEFAULT_OOB_PORT, *, timeout: float = 60.0
    ) -> OobChannel:
        """Listen on ``host:port`` and accept exactly one peer within ``timeout`` seconds."""
        listeners = await trio.open_tcp_listeners(port, host=host)
        try:
            with trio.move_on_after(timeout):
                stream = await listeners[0].accept()
                return cls(stream, timeout)
        finally:
            for listener in listeners:
                await listener.aclose()
        raise RemoteVerbsError(
            f"no out-of-band peer connected to {host}:{port} within {timeout:g} s"
        )

    async def send(self, obj: Any) -> None:
        data = msgpack.packb(obj, use_bin_type=True)
        with trio.move_on_after(self.timeout) as scope:
            await self.stream.send_all(_LEN.pack(len(data)) + data)
        if scope.cancelled_caught:
            raise RemoteVerbsError(f"out-of-band send blocked for {self.timeout:g} s")

    async def recv(self) -> Any:
        with trio.move_on_after(self.timeout):
            while True:
                if len(self._buf) >= _LEN.size:
                    (n,) = _LEN.unpack_from(self._buf)
                    if n > MAX_MESSAGE:
                        raise RemoteVerbsError(f"out-of-band message of {n} bytes > {MAX_MESSAGE}")
                    if len(self._buf) >= _LEN.size + n:
                        body = bytes(self._buf[_LEN.size : _LEN.size + n])
                        del self._buf[: _LEN.size + n]
                        try:
                            return msgpack.unpackb(body, raw=False)
                        except Exception as exc:  # msgpack raises several types
                            raise RemoteVerbsError(f"malformed out-of-band message: {exc}") from exc
                chunk = await self.stream.receive_some(65536)
                if not chunk:
                    raise RemoteVerbsError("out-of-band peer closed the connection")
                self._buf += chunk
        raise RemoteVerbsError(f"no out-of-band message within {self.timeout:g} s")

    async def exchange(
        self, local: list[QPInfo], extra: dict[str, Any] | None = None
    ) -> tuple[list[QPInfo], dict[str, Any]]:
        """Swap QP descriptions (and free-form parameters) with the peer."""
        await self.send({"qps": [asdict(q) for q in local], "extra": extra or {}})
        msg = await self.recv()
        if not isinstance(msg, dict) or not isinstance(msg.get("qps"), list):
            raise RemoteVerbsError(f"out-of-band peer sent {msg!r}, not a QP exchange")
        return [QPInfo.from_wire(q) for q in msg["qps"]], dict(msg.get("extra") or {})

    async def barrier(self, tag: str) -> None:
        await self.send({"barrier": tag})
        msg = await self.recv()
        if msg != {"barrier": tag}:
            raise RemoteVerbsError(f"out-of-band barrier {tag!r}: peer sent {msg!r}")

    async def aclose(self) -> None:
        await self.stream.aclose()


async def serve_requests(
    stream: trio.SocketStream,
    reply: Callable[[Any], Awaitable[Any]],
    timeout: float = math.inf,
) -> None:
    """Answer each message on ``stream`` with ``await reply(message)`` until the client goes:
    the loop of every control server (host agents, switches, the rendezvous store)."""
    chan = OobChannel(stream, timeout=timeout)
    try:
        while True:
            try:
                msg = await chan.recv()
            except RemoteVerbsError:
                return  # the client is done (or gone)
            await chan.send(await reply(msg))
    finally:
        await chan.aclose()


async def connect_qp(chan: OobChannel, qp: QP, mr: MR | None = None, **attrs: Any) -> QPInfo:
    """Swap QP data (and ``mr``'s rkey, address and length) with the peer over ``chan`` and
    bring ``qp`` to RTS towards it; ``attrs`` go to :meth:`QP.connect`.  Returns the peer's."""
    remote, _ = await chan.exchange([QPInfo.of(qp, mr)])
    if len(remote) != 1:
        raise RemoteVerbsError(f"out-of-band peer described {len(remote)} QPs, expected 1")
    qp.connect(remote[0].remote(), **attrs)
    return remote[0]
