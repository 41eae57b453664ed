"""A process computing a long window beats, and the coordinator's stall limit counts from its
last beat (rocev2_emu/runtime/sync_link.py, rocev2_emu/runtime/rounds.py)."""

from __future__ import annotations

import socket
import time

import msgpack
import trio
import trio.testing

from rocev2_emu.control.channel import LENGTH, MessageChannel
from rocev2_emu.runtime.coordinator import Coordinator
from rocev2_emu.runtime.rounds import STALL_SECONDS
from rocev2_emu.runtime.sync_link import SyncLink
from rocev2_emu.runtime.sync_messages import BEAT_SECONDS, Report, SyncError, is_beat
from tests.unit.runtime.outbox import Outbox


def _stopped_at(beats_until: float) -> tuple[float, str]:
    """When (mock seconds) and why the coordinator stops a run of processes a and b in which
    b computes its window from t = 0, beating every BEAT_SECONDS until ``beats_until``."""
    said: list[tuple[float, str]] = []

    async def main() -> None:
        c = Coordinator(["a", "b"], 1e-6, b"")
        for name in c.names:
            c.attach(name, Outbox())
        c.release()
        await c.take("a", Report(1.0, False, {}, 0))  # b is computing: no report

        async def rounds() -> None:
            try:
                await c.run_rounds()
            except SyncError as exc:
                said.append((trio.current_time(), str(exc)))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(rounds)
            while trio.current_time() + BEAT_SECONDS <= beats_until:
                await trio.sleep(BEAT_SECONDS)
                c.beat("b")
            await trio.sleep(10 * STALL_SECONDS)
            nursery.cancel_scope.cancel()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert len(said) == 1
    return said[0]


def test_a_process_that_beats_is_computing_and_is_named_stall_seconds_after_its_last_beat() -> None:
    """A worker of ~6 100 nodes of the 24 576-accelerator cluster took longer than the stall
    limit for a window on a busy machine, and the run stopped with "no report from" it: a
    process computing is not one that stopped.  It beats; once it stops beating (frozen,
    killed), it is named STALL_SECONDS after its last beat."""
    at, why = _stopped_at(300.0)
    assert at == 300.0 + STALL_SECONDS
    assert "no report from b" in why
    at, why = _stopped_at(0.0)  # never beat: named STALL_SECONDS after the round, as before
    assert at == STALL_SECONDS
    assert "no report from b" in why


def test_a_beat_is_only_a_beat() -> None:
    assert is_beat({"beat": True})
    assert not is_beat({"beat": 1}) and not is_beat({"beat": True, "next": 0.0})
    assert not is_beat(Report(1.0, False, {}, 0).wire())


def _messages(sock: socket.socket, within: float) -> list[object]:
    """The whole messages ``sock`` receives within ``within`` wall seconds."""
    deadline = time.monotonic() + within
    data = b""
    while (left := deadline - time.monotonic()) > 0:
        sock.settimeout(left)
        try:
            data += sock.recv(4096)
        except TimeoutError:
            break
    out = []
    while data:
        (n,) = LENGTH.unpack_from(data)
        out.append(msgpack.unpackb(data[LENGTH.size : LENGTH.size + n], raw=False))
        data = data[LENGTH.size + n :]
    return out


def test_a_link_beats_while_its_process_computes_and_never_while_it_reports_or_waits() -> None:
    """The beats come from a thread while the main thread computes (here: sleeps without
    yielding to trio), whole between the process's own messages, and stop when it reports."""
    seen: dict[str, list[object]] = {}

    async def main() -> None:
        ours, theirs = socket.socketpair()
        link = SyncLink(MessageChannel(trio.SocketStream(trio.socket.from_stdlib_socket(ours)), 5))
        link.beat_every = 0.05
        try:
            await link.send({"first": 1})
            seen["idle"] = _messages(theirs, 0.3)  # not computing: no beat
            link.computing(True)
            seen["computing"] = _messages(theirs, 0.5)
            link.computing(False)
            await link.send({"report": 1})
            seen["reported"] = _messages(theirs, 0.3)
        finally:
            await link.aclose()
            theirs.close()

    trio.run(main)
    assert seen["idle"] == [{"first": 1}]
    assert seen["computing"] and all(is_beat(m) for m in seen["computing"])
    assert seen["reported"] == [{"report": 1}]
