"""Frames between the processes of an exact run that the kernel would drop: taken off the
socket while a window computes, and an error - not a wait for the stall limit - when they
were lost anyway (rocev2_emu/runtime/exchange.py)."""

from __future__ import annotations

import contextlib
import select
import socket

import msgpack
import pytest
import trio
import trio.testing

from rocev2_emu.control.channel import LENGTH, MessageChannel
from rocev2_emu.runtime.events import Core, Node
from rocev2_emu.runtime.exact import ExactEngine
from rocev2_emu.runtime.exchange import RemoteLink
from rocev2_emu.runtime.ports import UdpPort
from rocev2_emu.runtime.sync import with_trailer
from rocev2_emu.runtime.sync_link import SyncLink
from rocev2_emu.runtime.sync_messages import SyncError


def _datagram(seq: int) -> bytes:
    vxlan = bytes([0x08, 0, 0, 0, 0, 0, 5, 0])  # VNI 5
    return with_trailer(vxlan + bytes(1000), seq * 1e-6, seq)


def _link(receive_buffer: int) -> tuple[ExactEngine, UdpPort, socket.socket]:
    udp = UdpPort(("127.0.0.1", 0), None, batch=False, receive_buffer=receive_buffer)
    peer = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    peer.bind(("127.0.0.1", 0))
    engine = ExactEngine("n0", udp, chan=None)  # type: ignore[arg-type]  # no windows here
    engine.link(RemoteLink(engine.add(Node("n0", Core())), 0, 5, "n1", peer.getsockname(), None))
    return engine, udp, peer


def _arrived(udp: UdpPort) -> None:
    readable, _, _ = select.select([udp.sock], [], [], 10)  # loopback: there at once
    assert readable, "no datagram within 10 s"


def test_datagrams_the_kernel_dropped_stop_the_run_at_once_naming_them() -> None:
    """A 24 576-accelerator run over four workers stopped after 18 min with "no progress for
    60 s: no report from" every worker: each waited for the tail of a burst of frames that its
    full receive buffer had dropped.  Now the process says so as soon as it misses them."""
    engine, udp, peer = _link(4096)  # the kernel's least: a few datagrams
    try:
        sent = 200
        for seq in range(1, sent + 1):
            peer.sendto(_datagram(seq), udp.address)
        assert udp.kernel_drops() > 0

        async def take_in() -> None:
            with trio.fail_after(10):
                await engine.exchange.take_in({"n1": sent})

        with pytest.raises(SyncError, match=r"n0: the kernel dropped \d+ datagrams") as info:
            trio.run(take_in)
        assert f"from n1: {engine.exchange.received} of {sent} received" in str(info.value)
    finally:
        udp.close()
        peer.close()


def test_a_gap_the_kernel_made_says_so_and_what_to_raise() -> None:
    """Frames dropped while a process computes show as a gap when a later frame comes: the
    error names the kernel's drops and the sysctl, not only a lost or reordered datagram."""
    engine, udp, peer = _link(4096)
    try:
        for seq in range(1, 201):
            peer.sendto(_datagram(seq), udp.address)
        engine.exchange.stash()  # the few that fitted
        peer.sendto(_datagram(201), udp.address)
        _arrived(udp)
        with pytest.raises(SyncError, match=r"the kernel dropped \d+ datagrams") as info:
            engine.exchange.pull()
        assert "(link " in str(info.value) and "came when" in str(info.value)
        assert "sysctl -w net.core.rmem_max=" in str(info.value)
    finally:
        udp.close()
        peer.close()


def test_frames_stashed_during_a_window_reach_the_heap_in_the_order_they_came() -> None:
    """Taken off the socket while a window computes (stash), frames go onto the heap at the
    next pull - after those stashed before them and before those still in the socket - so the
    run is the one it would have been."""
    engine, udp, peer = _link(1 << 20)
    try:
        peer.sendto(_datagram(1), udp.address)
        peer.sendto(_datagram(2), udp.address)
        _arrived(udp)
        engine.exchange.stash()
        assert engine.exchange.received == 0  # aside, not on the heap yet
        peer.sendto(_datagram(3), udp.address)
        _arrived(udp)
        engine.exchange.pull()
        assert engine.exchange.received == 3  # 1 and 2 first, then 3: no gap
        assert engine.events.next_event_time() == 1e-6
    finally:
        udp.close()
        peer.close()


def test_a_process_waiting_for_its_grant_in_the_kernel_takes_its_peers_frames_meanwhile() -> None:
    """A window's frames reach a process that already waits for its next grant: waiting in
    the kernel, it empties its link socket as they come (the drain) and goes on waiting."""
    drained: list[bytes] = []
    frames = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    frames.bind(("127.0.0.1", 0))
    frames.setblocking(False)
    peer = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)

    def drain() -> None:
        with contextlib.suppress(BlockingIOError):
            while True:
                drained.append(frames.recv(2048))

    async def main() -> tuple[bool, object]:
        ours, theirs = socket.socketpair()
        link = SyncLink(MessageChannel(trio.SocketStream(trio.socket.from_stdlib_socket(ours)), 5))
        link.drain_with(frames.fileno(), drain)
        try:
            peer.sendto(b"a frame", frames.getsockname())
            came, _ = link.recv_blocking(0.3)  # no grant: it drained, then timed out
            assert not came and drained == [b"a frame"]
            body = msgpack.packb({"until": 1.0}, use_bin_type=True)
            theirs.sendall(LENGTH.pack(len(body)) + body)
            return link.recv_blocking(10.0)
        finally:
            await link.aclose()
            theirs.close()

    try:
        assert trio.run(main) == (True, {"until": 1.0})
    finally:
        frames.close()
        peer.close()


def test_a_process_waiting_for_its_grant_in_trio_takes_its_peers_frames_and_keeps_the_grant() -> (
    None
):
    """Past its wait in the kernel a process waits for its grant in trio (serving control
    requests and the application): its link socket is emptied as frames come there too, and a
    wake that comes as the grant is taken (the application resuming) loses no grant - a grant
    lost hangs the run, as a first try at this drain did."""
    udp = UdpPort(("127.0.0.1", 0), None, batch=False, receive_buffer=1 << 20)
    peer = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    peer.bind(("127.0.0.1", 0))

    async def main() -> None:
        ours, theirs = socket.socketpair()
        chan = MessageChannel(trio.SocketStream(trio.socket.from_stdlib_socket(ours)), 5)
        engine = ExactEngine("n0", udp, chan=chan)
        node = engine.add(Node("n0", Core()))
        engine.link(RemoteLink(node, 0, 5, "n1", peer.getsockname(), None))
        link = engine.chan
        assert link is not None
        taken = link.recv

        async def woken_as_taken() -> object:
            message = await taken()
            engine._wake_barrier()  # e.g. the application resumed in this very batch
            return message

        link.recv = woken_as_taken  # type: ignore[method-assign]
        try:
            async with trio.open_nursery() as nursery:
                got: list[tuple[bool, object]] = []

                async def wait() -> None:
                    got.append(await engine._await_coordinator(link))

                nursery.start_soon(wait)
                await trio.testing.wait_all_tasks_blocked()
                for seq in (1, 2):
                    peer.sendto(_datagram(seq), udp.address)
                await trio.testing.wait_all_tasks_blocked()  # (loopback: there at once)
                assert len(engine.exchange._stash) == 2  # aside, in the order they came
                assert not got  # and still waiting for the grant
                body = msgpack.packb({"until": 1.0}, use_bin_type=True)
                theirs.sendall(LENGTH.pack(len(body)) + body)
            assert got == [(False, {"until": 1.0})]
            engine.exchange.pull()
            assert engine.exchange.received == 2
        finally:
            await link.aclose()
            theirs.close()

    try:
        trio.run(main)
    finally:
        udp.close()
        peer.close()
