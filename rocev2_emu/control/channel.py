"""Control-plane framing: length-prefixed msgpack maps over TCP, and the request loop of every
control server (host agents, switch control, the rendezvous store).

A message is a 4-byte big-endian length and a msgpack body (at most :data:`MAX_MESSAGE`
bytes).  Every send and receive has a deadline; a framing fault, a closed peer or a passed
deadline is a :class:`ControlError` naming what happened, never a hang.

A server holds at most :data:`MAX_CONNECTIONS` authenticated clients and, on their own, at
most :data:`MAX_UNPROVEN` that have not yet proved the secret (:func:`connection_limit`: one
more admitted is closed at once; a newcomer to full unproven slots closes the oldest unproven
one), so sockets that never authenticate cannot take an authenticated client's place nor keep
one out; before its proof a client may send no message longer than
:data:`MAX_PROOF` bytes (a proof is about 45), so it cannot make the server hold a megabyte for
it; and a client that starts a message must finish it within :data:`MESSAGE_DEADLINE` seconds
(a slow or stalled sender is dropped).  Each is counted in
``rocev2_control_connections_dropped_total`` by ``reason`` (``connection_limit``,
``unproven_limit``, ``slow_sender``, ``auth_failed``).

A server given the fabric secret (:mod:`rocev2_emu.control.auth`) opens every connection with
a challenge and serves nothing until the client proves it holds the secret; a client given the
secret answers before its first request.  A failed or late proof is answered with an error,
counted (``auth_failed``) and the connection closed.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import math
import os
import signal
import socket
import struct
import threading
from collections.abc import Awaitable, Callable
from typing import Any, ClassVar, Final, TypeVar

import msgpack
import trio
from prometheus_client import Counter

from rocev2_emu.control import auth

log = logging.getLogger(__name__)

LENGTH: Final = struct.Struct("!I")  # message length, network order
MAX_MESSAGE: Final = 1 << 20
S = TypeVar("S", bound=trio.abc.Stream)
MAX_CONNECTIONS: Final = 256  # authenticated clients one control server holds at once
MAX_UNPROVEN: Final = 64  # clients it holds at once that have not proved the secret yet
MAX_PROOF: Final = 512  # bytes of the longest message before the proof (a proof: about 45)
MESSAGE_DEADLINE: Final = 30.0  # seconds from a message's first byte to its last
AUTH_DEADLINE: Final = 10.0  # seconds a client has to prove it holds the fabric secret


# every node's /metrics serves it beside its own families (rocev2_emu.runtime.metrics.serve)
REJECTED = Counter(
    "rocev2_control_requests_rejected",
    "Control requests refused with an error (by the exception that refused them)",
    ["reason"],
    registry=None,
)


DROPPED = Counter(
    "rocev2_control_connections_dropped",
    "Control connections a server closed to protect itself (by reason)",
    ["reason"],
    registry=None,
)


class ControlError(Exception):
    """A control connection failed: framing, a closed peer, or a deadline."""


class MessageChannel:
    """A TCP stream carrying length-prefixed msgpack messages."""

    error: ClassVar[type[Exception]] = ControlError  # what this channel raises
    what: ClassVar[str] = "control"  # how its messages are named in errors

    def __init__(self, stream: trio.abc.Stream, timeout: float) -> None:
        self.stream = stream
        self.timeout = timeout
        self._buf = bytearray()
        self.slow = False  # the last recv gave up on a message that had begun

    def take_read_ahead(self) -> bytearray:
        """What was read past the last message (a connection handed to another framing of
        the same stream takes it); the channel keeps none of it."""
        ahead, self._buf = self._buf, bytearray()
        return ahead

    async def send(self, obj: Any) -> None:
        try:
            data = msgpack.packb(obj, use_bin_type=True)
        except (TypeError, ValueError, OverflowError) as exc:
            raise self.error(f"cannot encode a {self.what} message: {exc}") from exc
        with trio.move_on_after(self.timeout) as scope:
            try:
                await self.stream.send_all(LENGTH.pack(len(data)) + data)
            except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                raise self.error(f"{self.what} peer went away: {exc}") from exc
        if scope.cancelled_caught:
            raise self.error(f"{self.what} send blocked for {self.timeout:g} s")

    async def recv(self, *, message_deadline: float = math.inf, max_size: int = MAX_MESSAGE) -> Any:
        """The next message within ``timeout``; once its first byte is here, the rest must come
        within ``message_deadline`` too (else :attr:`slow` is set and the error says so).  One
        announcing more than ``max_size`` bytes is an error at once."""
        begun = bool(self._buf)
        with trio.move_on_after(self.timeout) as scope:
            if begun:
                scope.deadline = min(scope.deadline, trio.current_time() + message_deadline)
            while True:
                if len(self._buf) >= LENGTH.size:
                    (n,) = LENGTH.unpack_from(self._buf)
                    if n > max_size:
                        head = bytes(self._buf[:16])
                        raise self.error(
                            f"the {self.what} peer is not a rocev2-emu peer (its first bytes "
                            f"{head!r} announce a message of {n} bytes > {max_size})"
                        )
                    if len(self._buf) >= LENGTH.size + n:
                        body = bytes(self._buf[LENGTH.size : LENGTH.size + n])
                        del self._buf[: LENGTH.size + n]
                        try:
                            return msgpack.unpackb(body, raw=False)
                        except Exception as exc:  # msgpack raises several types
                            raise self.error(f"malformed {self.what} message: {exc}") from exc
                try:
                    chunk = await self.stream.receive_some(65536)
                except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                    raise self.error(f"{self.what} peer went away: {exc}") from exc
                if not chunk:
                    raise self.error(f"{self.what} peer closed the connection")
                self._buf += chunk
                if not begun:
                    begun = True
                    scope.deadline = min(scope.deadline, trio.current_time() + message_deadline)
        if begun and self._buf:
            self.slow = True
            raise self.error(
                f"a {self.what} message began but did not end within the deadline "
                f"({len(self._buf)} bytes of it arrived)"
            )
        raise self.error(f"no {self.what} message within {self.timeout:g} s")

    async def aclose(self) -> None:
        await self.stream.aclose()


async def serve_requests(
    stream: trio.abc.Stream,
    reply: Callable[[Any], Awaitable[Any]],
    timeout: float = math.inf,
    message_deadline: float = MESSAGE_DEADLINE,
    secret: bytes | None = None,
) -> None:
    """Answer each message on ``stream`` with ``await reply(message)`` until the client goes:
    the loop of every control server.  A request the handler cannot take (a missing field, a
    wrong type, a value out of range) is answered with an error and counted in
    ``rocev2_control_requests_rejected_total``; a client that resets the connection, sends
    garbage, or starts a message and does not finish it within ``message_deadline`` is dropped;
    none of them ends the server.  With ``secret``, the client must first prove it holds it
    (:func:`authenticate`); one that does not is refused before any request is read."""
    chan = MessageChannel(stream, timeout=timeout)
    try:
        if secret is not None and not await authenticate(chan, secret):
            return
        if not admit():
            return
        while True:
            try:
                msg = await chan.recv(message_deadline=message_deadline)
            except ControlError:
                if chan.slow:
                    DROPPED.labels(reason="slow_sender").inc()
                return  # the client is done, gone, or sent what is not a message
            try:
                answer = await reply(msg)
            except Exception as exc:  # what a client sends never ends the server
                REJECTED.labels(reason=type(exc).__name__).inc()
                log.info("control request %.200r refused: %r", msg, exc)
                answer = {"error": f"bad request: {type(exc).__name__}: {exc}"}
            try:
                await chan.send(answer)
            except ControlError:
                return
    finally:
        await chan.aclose()


async def authenticate(chan: MessageChannel, secret: bytes) -> bool:
    """Challenge the client; True if it answered with the proof in time (else it is told,
    counted and the caller closes)."""
    message, nonce = auth.challenge_message()
    timeout, chan.timeout = chan.timeout, AUTH_DEADLINE
    try:
        await chan.send(message)
        answer = await chan.recv(message_deadline=AUTH_DEADLINE, max_size=MAX_PROOF)
    except ControlError:
        DROPPED.labels(reason="auth_failed").inc()
        return False
    finally:
        chan.timeout = timeout
    if not auth.check_answer(secret, nonce, answer):
        DROPPED.labels(reason="auth_failed").inc()
        log.info("control client failed the fabric-secret challenge")
        with trio.move_on_after(1.0), contextlib.suppress(ControlError):
            await chan.send({"error": "authentication failed: not this fabric's secret"})
        return False
    try:
        await chan.send({"ok": True})
    except ControlError:
        return False
    return True


class _Slots:
    """One server's connections: those not yet admitted (proving the secret), oldest first,
    each with the cancel scope that closes it, and how many are in.  Grows to the limits."""

    def __init__(self, limit: int, unproven_limit: int) -> None:
        self.limit = limit
        self.unproven_limit = unproven_limit
        self.unproven: dict[object, trio.CancelScope] = {}  # insertion order: oldest first
        self.admitted = 0


# the slots of the server this connection's task serves, and its key there (None: admitted)
_SLOT: contextvars.ContextVar[tuple[_Slots, list[object | None]] | None] = contextvars.ContextVar(
    "control_slot", default=None
)


def admit() -> bool:
    """Move this connection from the unproven to the admitted slots (once it proved the secret,
    or at once on a server without one); False, counted, when those are full."""
    entry = _SLOT.get()
    if entry is None:
        return True
    slots, state = entry
    if state[0] is None:
        return True
    if slots.admitted >= slots.limit:
        DROPPED.labels(reason="connection_limit").inc()
        return False
    del slots.unproven[state[0]]
    slots.admitted += 1
    state[0] = None
    return True


def connection_limit(
    handler: Callable[[S], Awaitable[None]],
    limit: int = MAX_CONNECTIONS,
    unproven_limit: int = MAX_UNPROVEN,
) -> Callable[[S], Awaitable[None]]:
    """``handler`` for ``trio.serve_listeners``, holding at most ``limit`` admitted connections
    and ``unproven_limit`` not yet admitted (:func:`serve_requests` admits a connection once it
    proved the secret).  One more admitted is closed at once (``reason="connection_limit"``);
    a newcomer when the unproven slots are full closes the oldest unproven connection instead
    (``reason="unproven_limit"``): silent sockets cannot keep a client with the secret out,
    they can only push each other out."""
    slots = _Slots(limit, unproven_limit)

    async def handle(stream: S) -> None:
        if len(slots.unproven) >= slots.unproven_limit:
            DROPPED.labels(reason="unproven_limit").inc()
            oldest = next(iter(slots.unproven))
            slots.unproven.pop(oldest).cancel()
        key = object()
        state: list[object | None] = [key]
        token = _SLOT.set((slots, state))
        try:
            with trio.CancelScope() as scope:
                slots.unproven[key] = scope
                await handler(stream)
            if scope.cancelled_caught:
                await trio.aclose_forcefully(stream)
        finally:
            if state[0] is None:
                slots.admitted -= 1
            else:
                slots.unproven.pop(key, None)
            _SLOT.reset(token)

    return handle


def _refused(exc: OSError) -> bool:
    """Whether every address trio tried refused the connection (nothing listens there)."""
    causes = getattr(exc.__cause__, "exceptions", None) or [exc]
    return all(isinstance(e, ConnectionRefusedError) for e in causes)


async def open_channel(
    host: str,
    port: int,
    *,
    timeout: float,
    channel: type[MessageChannel] = MessageChannel,
    wait_for_listener: bool = True,
    secret: bytes | None = None,
) -> MessageChannel:
    """Connect to a server, retrying until ``timeout`` (wall seconds) while nothing listens
    yet; with ``wait_for_listener=False`` a refused connection is an error at once.  A name
    that does not resolve is an error at once either way.  With ``secret``, answer the
    server's challenge before returning (a refusal is an error naming the secret)."""
    with trio.move_on_after(timeout):
        while True:
            try:
                stream = await trio.open_tcp_stream(host, port)
            except socket.gaierror as exc:
                raise channel.error(f"cannot resolve {host!r}: {exc.strerror}") from exc
            except OSError as exc:
                if not wait_for_listener and _refused(exc):
                    raise channel.error(
                        f"connection refused by {host}:{port}: nothing listens there (is the "
                        f"{channel.what} peer running?)"
                    ) from exc
                await trio.sleep(0.05)
                continue
            chan = channel(stream, timeout)
            if secret is not None:
                await prove_secret(chan, secret, f"{host}:{port}")
            return chan
    raise channel.error(f"no {channel.what} peer listening on {host}:{port} within {timeout:g} s")


async def prove_secret(chan: MessageChannel, secret: bytes, where: str) -> None:
    """Answer a server's challenge; close and raise if it refuses."""
    try:
        try:
            await chan.send(auth.answer_message(secret, await chan.recv()))
        except auth.AuthError as exc:
            raise chan.error(f"{where}: {exc}") from exc
        reply = await chan.recv()
        if reply != {"ok": True}:
            said = reply.get("error") if isinstance(reply, dict) else reply
            raise chan.error(
                f"{where} refused this client: {said!r:.120} (not this fabric's secret? "
                "docs/security.md)"
            )
    except BaseException:
        await chan.aclose()
        raise


async def stop_soon(msg: object = None) -> dict[str, object]:
    """The ``stop`` command of every node: end this process as ``docker stop`` or a crash would
    (SIGTERM, a moment of wall time after the reply leaves), so users can watch the fabric
    react.  The moment is a timer thread's, not a trio sleep: in an exact run trio's clock is
    emulated time, which would wait for the run to reach it."""
    threading.Timer(0.1, os.kill, (os.getpid(), signal.SIGTERM)).start()
    return {"ok": True, "pid": os.getpid()}
