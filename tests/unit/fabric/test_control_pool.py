"""The control pool: requests to a node share one authenticated connection, and a connection
whose request failed or was cancelled is never used again (the next request makes a new one)."""

from __future__ import annotations

from typing import Any

import trio

from rocev2_emu.control import auth
from rocev2_emu.control.channel import serve_requests
from rocev2_emu.fabric.agent import CONTROL_PORT
from rocev2_emu.fabric.control import ControlPool

ADDRESS = "127.201.13.1"  # a loopback address no other test uses


async def test_requests_share_a_connection_and_a_cancelled_one_is_replaced() -> None:
    secret = auth.new()
    auth.use(secret)
    accepted = 0
    never = trio.Event()

    async def reply(msg: Any) -> Any:
        if msg["cmd"] == "hang":
            await never.wait()
        return {"echo": msg["n"]}

    async def handle(stream: trio.SocketStream) -> None:
        nonlocal accepted
        accepted += 1
        await serve_requests(stream, reply, timeout=60.0, secret=secret)

    pool = ControlPool(timeout=10.0)
    try:
        async with trio.open_nursery() as nursery:
            listeners = await trio.open_tcp_listeners(CONTROL_PORT, host=ADDRESS)
            nursery.start_soon(trio.serve_listeners, handle, listeners)
            got = [(await pool.ask(ADDRESS, {"cmd": "echo", "n": n}))["echo"] for n in range(5)]
            assert got == [0, 1, 2, 3, 4]
            assert (pool.connects, accepted) == (1, 1)

            with trio.move_on_after(0.2) as scope:  # cancelled while its reply is awaited
                await pool.ask(ADDRESS, {"cmd": "hang", "n": 0})
            assert scope.cancelled_caught
            assert (await pool.ask(ADDRESS, {"cmd": "echo", "n": 7}))["echo"] == 7
            assert (pool.connects, accepted) == (2, 2)  # the half-used connection was dropped
            nursery.cancel_scope.cancel()
    finally:
        await pool.aclose()
        auth.use(None)
