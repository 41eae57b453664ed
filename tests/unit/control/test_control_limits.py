"""A control server's self-protection: a client that starts a message and stalls is dropped
after the message deadline, and connections beyond the limit are closed at once, each counted
by reason.  In-memory streams under MockClock: deadlines pass in virtual time, no wall clock."""

from __future__ import annotations

import struct
from typing import Any

import msgpack
import trio
import trio.testing

from rocev2_emu.control import auth
from rocev2_emu.control.channel import (
    DROPPED,
    MessageChannel,
    connection_limit,
    prove_secret,
    serve_requests,
)

LEN = struct.Struct("!I")


def dropped(reason: str) -> float:
    return float(DROPPED.labels(reason=reason)._value.get())


async def echo(msg: Any) -> Any:
    return {"echo": msg}


def run(main: Any) -> None:
    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


def frame(obj: Any) -> bytes:
    body: bytes = msgpack.packb(obj)
    return LEN.pack(len(body)) + body


def test_a_stalled_half_message_is_dropped_after_the_deadline_and_counted() -> None:
    before = dropped("slow_sender")
    ended_at: list[float] = []

    async def main() -> None:
        server, client = trio.testing.memory_stream_pair()

        async def serve() -> None:
            await serve_requests(server, echo, timeout=3600.0, message_deadline=5.0)
            ended_at.append(trio.current_time())

        async with trio.open_nursery() as nursery:
            nursery.start_soon(serve)
            await client.send_all(frame("hello"))
            reply = await client.receive_some()
            assert msgpack.unpackb(reply[4:]) == {"echo": "hello"}
            start = trio.current_time()
            await client.send_all(frame("never finished")[:6])  # length and 2 body bytes
            assert await client.receive_some() == b""  # the server hung up
            assert trio.current_time() - start == 5.0  # at the message deadline
            await trio.testing.wait_all_tasks_blocked()
            assert ended_at == [start + 5.0]

    run(main)
    assert dropped("slow_sender") == before + 1


def test_an_idle_client_between_messages_is_not_a_slow_sender() -> None:
    before = dropped("slow_sender")

    async def main() -> None:
        server, client = trio.testing.memory_stream_pair()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(serve_requests, server, echo, 3600.0, 5.0)
            await trio.sleep(60.0)  # quiet far beyond the message deadline: still served
            await client.send_all(frame(1))
            assert msgpack.unpackb((await client.receive_some())[4:]) == {"echo": 1}
            await client.aclose()

    run(main)
    assert dropped("slow_sender") == before


def test_connections_beyond_the_limit_are_closed_at_once_and_counted() -> None:
    before = dropped("connection_limit")

    async def main() -> None:
        handle = connection_limit(lambda s: serve_requests(s, echo), limit=2)
        pairs = [trio.testing.memory_stream_pair() for _ in range(3)]
        async with trio.open_nursery() as nursery:
            for server, _ in pairs:  # one by one: trio may run a batch of new tasks reversed
                nursery.start_soon(handle, server)
                await trio.testing.wait_all_tasks_blocked()
            assert await pairs[2][1].receive_some() == b""  # the third: closed unserved
            for _, client in pairs[:2]:  # the first two are served
                await client.send_all(frame("x"))
                assert msgpack.unpackb((await client.receive_some())[4:]) == {"echo": "x"}
            await pairs[0][1].aclose()  # one leaves: a new client is let in
            await trio.testing.wait_all_tasks_blocked()
            server, client = trio.testing.memory_stream_pair()
            nursery.start_soon(handle, server)
            await client.send_all(frame("y"))
            assert msgpack.unpackb((await client.receive_some())[4:]) == {"echo": "y"}
            for c in (pairs[1][1], client):
                await c.aclose()

    run(main)
    assert dropped("connection_limit") == before + 1


def test_clients_that_never_prove_the_secret_cannot_keep_an_authenticated_client_out() -> None:
    """Issue 28: 256 connections without the secret filled every slot and a client with the
    secret was refused until they closed; they had slots of their own then, and 64 silent ones
    re-opened as the server dropped them still kept a client out (issue 59).  A newcomer to
    full unproven slots now closes the oldest unproven connection: strangers push each other
    out, and the client with the secret, the newest, proves it and is served."""
    before = dropped("unproven_limit")
    secret = auth.new()

    async def main() -> None:
        handle = connection_limit(
            lambda s: serve_requests(s, echo, secret=secret), limit=4, unproven_limit=3
        )
        async with trio.open_nursery() as nursery:
            strangers = []
            for _ in range(5):  # they connect and say nothing: the two oldest are closed
                server, client = trio.testing.memory_stream_pair()
                strangers.append(client)
                nursery.start_soon(handle, server)
                await trio.testing.wait_all_tasks_blocked()
            for stranger in strangers[:2]:
                while await stranger.receive_some():  # the challenge, then the close
                    pass
            # a client with the secret while three strangers still hold every unproven slot
            server, client = trio.testing.memory_stream_pair()
            nursery.start_soon(handle, server)
            chan = MessageChannel(client, timeout=10.0)
            await prove_secret(chan, secret, "the test server")
            await chan.send("x")
            assert await chan.recv() == {"echo": "x"}
            # admitted, it is out of reach of the strangers that come after it
            for _ in range(4):
                server, _other = trio.testing.memory_stream_pair()
                nursery.start_soon(handle, server)
                await trio.testing.wait_all_tasks_blocked()
            await chan.send("y")
            assert await chan.recv() == {"echo": "y"}
            nursery.cancel_scope.cancel()

    run(main)
    assert dropped("unproven_limit") == before + 6  # 2 + 1 (for the client) + 3


def test_before_its_proof_a_client_cannot_make_the_server_hold_a_megabyte() -> None:
    before = dropped("auth_failed")
    secret = auth.new()

    async def main() -> None:
        server, client = trio.testing.memory_stream_pair()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(serve_requests, server, echo, 3600.0, 30.0, secret)
            await client.receive_some()  # the challenge
            await client.send_all(LEN.pack((1 << 20) - 1) + b"x" * 100)  # "a proof" of 1 MiB
            data = b""
            while chunk := await client.receive_some():  # refused at once, then closed
                data += chunk
            assert trio.current_time() == 0.0  # no deadline waited out

    run(main)
    assert dropped("auth_failed") == before + 1
