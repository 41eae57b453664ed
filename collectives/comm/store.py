"""The rendezvous: a small key-value store through which ranks find each other.

As NCCL's bootstrap (and torch's TCPStore), ranks publish what their peers need - here the
emulated GID, QPNs, PSNs, slot addresses and rkeys - and block until what they need from others
appears.  :class:`StoreServer` serves it over TCP (length-prefixed msgpack, the framing of
the verbs API's :class:`~rocev2_emu.verbs.oob.OobChannel`), run by the launcher;
:class:`TcpStore` is the rank's client;
:class:`MemoryStore` is the same store inside one process (virtual time, where real sockets
would let the mock clock jump while a request is in flight).

Operations: ``set(key, value)``; ``get(key, timeout)`` waits until the key exists; ``take(key,
timeout)`` is a ``get`` that removes the key (what one peer reads once, so the store does not
keep every connection a job made); ``add(key, n)`` adds to a counter and returns it.  Every
wait has a deadline; a passed deadline raises :class:`StoreTimeout` naming the key.

In emulated time the store is a node of the emulation (:mod:`rocev2_emu.control.kvstore`): each
operation takes :data:`~rocev2_emu.control.kvstore.STORE_LATENCY` to reach it and as long back,
and the store applies them in one order (:mod:`rocev2_emu.fabric.rendezvous`: a host's client
of it, the virtual fabric's store, an exact run's), so a job's rendezvous is the same in both.
"""

from __future__ import annotations

from typing import Any, Protocol

import trio

from rocev2_emu.fabric.rendezvous import EmulatedStore, StoreTimeout, VirtualStore, exact_store
from rocev2_emu.verbs import (
    OobChannel,
    RemoteVerbsError,
    connection_limit,
    fabric_secret,
    serve_requests,
)

__all__ = [
    "EmulatedStore",
    "MemoryStore",
    "Store",
    "StoreServer",
    "StoreTimeout",
    "TcpStore",
    "VirtualStore",
    "exact_store",
]


class Store(Protocol):
    async def set(self, key: str, value: Any) -> None: ...

    async def get(self, key: str, timeout: float) -> Any: ...

    async def take(self, key: str, timeout: float) -> Any:
        """``get``, and the key is gone: a value that one reader reads once."""
        ...

    async def add(self, key: str, amount: int) -> int: ...

    async def arrive(self, key: str, count: int, timeout: float) -> None:
        """Add one to counter ``key`` and wait until it reaches ``count`` (a barrier)."""
        ...


MAX_KEY = 1024  # characters in a key
MAX_KEYS = 1 << 20  # keys in one store: a job of thousands of ranks needs tens of thousands
MAX_WAIT = 1e9  # the longest a get may wait, wall seconds: finite (an abort watch waits long)
INT64 = (-(1 << 63), (1 << 63) - 1)  # what a counter holds (and msgpack carries)


class MemoryStore:
    """The store in this process; ``timeout`` is in trio time (virtual or wall seconds)."""

    def __init__(self) -> None:
        self.data: dict[str, Any] = {}
        self._changed = trio.lowlevel.ParkingLot()

    async def set(self, key: str, value: Any) -> None:
        self.data[key] = value
        self._changed.unpark_all()

    async def add(self, key: str, amount: int) -> int:
        value = int(self.data.get(key, 0)) + amount
        await self.set(key, value)
        return value

    async def get(self, key: str, timeout: float) -> Any:
        await self._appeared(key, timeout)
        return self.data[key]

    async def take(self, key: str, timeout: float) -> Any:
        await self._appeared(key, timeout)
        return self.data.pop(key)

    async def _appeared(self, key: str, timeout: float) -> None:
        """Wait until ``key`` is held (no await after it: the caller reads it at once)."""
        with trio.move_on_after(timeout):
            while key not in self.data:
                await self._changed.park()
            return
        raise StoreTimeout(f"rendezvous key {key!r} did not appear within {timeout:g} s")

    async def arrive(self, key: str, count: int, timeout: float) -> None:
        await self.add(key, 1)
        await self.wait_count(key, count, timeout)

    async def wait_count(self, key: str, count: int, timeout: float) -> None:
        with trio.move_on_after(timeout):
            while int(self.data.get(key, 0)) < count:
                await self._changed.park()
            return
        raise StoreTimeout(f"rendezvous counter {key!r} did not reach {count} in {timeout:g} s")


class StoreServer:
    """Serves a :class:`MemoryStore` over TCP: one task per client connection."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0, secret: bytes | None = None) -> None:
        self.host = host
        self.port = port
        self.store = MemoryStore()
        self.secret = secret  # what clients must prove (None: this process's fabric secret)

    async def serve(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        self.secret = self.secret or fabric_secret()  # no secret, no server
        listeners = await trio.open_tcp_listeners(self.port, host=self.host)
        self.port = listeners[0].socket.getsockname()[1]
        task_status.started(self.port)
        await trio.serve_listeners(connection_limit(self._handle), listeners)

    async def _handle(self, stream: trio.SocketStream) -> None:
        await serve_requests(stream, self._reply, secret=self.secret or fabric_secret())

    async def _reply(self, msg: Any) -> dict[str, Any]:
        """One request, checked field by field: a bad one gets an error naming what is wrong."""
        if not isinstance(msg, dict):
            return {"error": f"a store request is a map, not {type(msg).__name__}"}
        op, key = msg.get("op"), msg.get("key")
        if not isinstance(key, str) or not 0 < len(key) <= MAX_KEY:
            return {"error": f"key {key!r:.80}: a string of 1 to {MAX_KEY} characters"}
        try:
            if op == "set":
                if key not in self.store.data and len(self.store.data) >= MAX_KEYS:
                    return {"error": f"the store holds {MAX_KEYS} keys, its limit"}
                await self.store.set(key, msg.get("value"))
                return {"ok": True}
            if op == "add":
                amount = msg.get("amount", 1)
                if not isinstance(amount, int) or isinstance(amount, bool):
                    return {"error": f"amount {amount!r:.80}: an integer"}
                current = self.store.data.get(key, 0)
                if not isinstance(current, int) or not INT64[0] <= current + amount <= INT64[1]:
                    return {"error": f"counter {key!r}: {current!r:.40} + {amount} is no int64"}
                return {"value": await self.store.add(key, amount)}
            if op in ("get", "take"):
                timeout = msg.get("timeout", 0)
                if (
                    not isinstance(timeout, int | float)
                    or isinstance(timeout, bool)
                    or not 0 <= timeout <= MAX_WAIT
                ):
                    return {"error": f"timeout {timeout!r:.80}: seconds from 0 to {MAX_WAIT:g}"}
                wait = self.store.take if op == "take" else self.store.get
                return {"value": await wait(key, float(timeout))}
        except StoreTimeout as exc:
            return {"timeout": str(exc)}
        return {"error": f"unknown store operation {op!r:.80} (set, add, get, take)"}


class TcpStore:
    """A rank's client of :class:`StoreServer`; every request has a wall-clock deadline."""

    def __init__(self, chan: OobChannel) -> None:
        self.chan = chan
        self._lock = trio.Lock()

    @classmethod
    async def connect(
        cls, host: str, port: int, timeout: float = 30.0, *, wait_for_listener: bool = True
    ) -> TcpStore:
        """``wait_for_listener=False``: a refused connection is an error at once (a store its
        launcher served before asking anyone to connect)."""
        chan = await OobChannel.connect(
            host, port, timeout=timeout, wait_for_listener=wait_for_listener, secret=fabric_secret()
        )
        return cls(chan)

    async def _call(self, msg: dict[str, Any], timeout: float) -> Any:
        async with self._lock:  # one request at a time on the connection
            self.chan.timeout = timeout + 10.0  # the server answers a timed-out get itself
            await self.chan.send(msg)
            reply = await self.chan.recv()
        if not isinstance(reply, dict):
            raise RemoteVerbsError(f"rendezvous server sent {reply!r}")
        if "timeout" in reply:
            raise StoreTimeout(reply["timeout"])
        if "error" in reply:
            raise RemoteVerbsError(f"rendezvous server: {reply['error']}")
        return reply.get("value")

    async def set(self, key: str, value: Any) -> None:
        await self._call({"op": "set", "key": key, "value": value}, 10.0)

    async def add(self, key: str, amount: int) -> int:
        return int(await self._call({"op": "add", "key": key, "amount": amount}, 10.0))

    async def get(self, key: str, timeout: float) -> Any:
        return await self._call({"op": "get", "key": key, "timeout": timeout}, timeout)

    async def take(self, key: str, timeout: float) -> Any:
        return await self._call({"op": "take", "key": key, "timeout": timeout}, timeout)

    async def arrive(self, key: str, count: int, timeout: float) -> None:
        """The last to arrive says so under ``key/done``, which the others wait for."""
        if await self.add(key, 1) >= count:
            await self.set(f"{key}/done", 1)
        await self.get(f"{key}/done", timeout)

    async def aclose(self) -> None:
        await self.chan.aclose()
