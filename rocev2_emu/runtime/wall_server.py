"""The control ports of an exact run's process, served on the wall clock in a thread of their
own (:class:`WallServer`), each request answered inside the emulation's trio run at its current
emulated instant.
"""

from __future__ import annotations

import threading
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from rocev2_emu.control.channel import connection_limit, serve_requests

Reply = Callable[[Any], Awaitable[Any]]


class WallServer:
    """The control ports of an exact process (one per node it hosts), served on the wall clock
    in one thread of their own: their deadlines (a client that does not authenticate, a
    half-sent request) are real seconds and never emulated events, which would move the
    fabric's clock.  Each request to ``address`` is answered by ``ports[address]`` inside the
    emulation's trio run, at its current emulated instant; every port has its own connection
    limits (:func:`~rocev2_emu.control.channel.connection_limit`).  One thread, not one per
    node: a process hosting a hundred nodes (``--workers``) would otherwise carry a hundred
    event loops beside its engine."""

    def __init__(
        self,
        ports: dict[tuple[str, int], Reply],
        secret: bytes,
        interrupt: Callable[[], None] | None = None,
    ) -> None:
        """``interrupt``: called (in the server's thread) before each request is handed to
        the emulation's trio run (:meth:`ExactEngine.interrupt`)."""
        self.ports = ports
        self.secret = secret
        self.interrupt = interrupt
        self._token: trio.lowlevel.TrioToken | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None

    async def start(self) -> None:
        """Listen (in the thread), from inside the emulation's trio run; errors if it cannot."""
        self._token = trio.lowlevel.current_trio_token()
        thread = threading.Thread(target=self._thread, name="wall-control", daemon=True)
        thread.start()
        await trio.to_thread.run_sync(self._ready.wait, abandon_on_cancel=True)
        if self._error is not None:
            raise self._error

    def _thread(self) -> None:
        try:
            trio.run(self._serve)
        except BaseException as exc:
            self._error = exc
            self._ready.set()

    async def _serve(self) -> None:
        served = []
        for (host, port), reply in self.ports.items():
            listeners = await trio.open_tcp_listeners(port, host=host)
            served.append((connection_limit(self._connection(reply)), listeners))
        self._ready.set()
        async with trio.open_nursery() as nursery:
            for handler, listeners in served:
                nursery.start_soon(trio.serve_listeners, handler, listeners)

    def _connection(self, reply: Reply) -> Callable[[trio.SocketStream], Awaitable[None]]:
        token, interrupt = self._token, self.interrupt

        def call(msg: Any) -> Any:
            if interrupt is not None:
                interrupt()
            return trio.from_thread.run(reply, msg, trio_token=token)

        async def bridge(msg: Any) -> Any:
            return await trio.to_thread.run_sync(call, msg)

        async def connection(stream: trio.SocketStream) -> None:
            await serve_requests(stream, bridge, timeout=3600.0, secret=self.secret)

        return connection
