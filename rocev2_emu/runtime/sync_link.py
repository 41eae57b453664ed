"""A sync connection once its handshake is done: the length-prefixed msgpack of
:class:`~rocev2_emu.control.channel.MessageChannel` on the connection's socket directly, so
that a report or a grant costs no pass of trio's scheduler (a window costs every process one
of each).  One per node process at the coordinator, one in each node process; its buffer holds
at most one read (64 KiB) and what is left of a message.  A node's link also says, from a
thread of its own, that the process is still computing a long window (:meth:`SyncLink.computing`).
"""

from __future__ import annotations

import os
import select
import socket
import threading
import time
from collections.abc import Callable
from typing import Any, Final

import msgpack
import trio

from rocev2_emu.control.channel import LENGTH, ControlError, MessageChannel
from rocev2_emu.runtime.sync_messages import BEAT, BEAT_SECONDS

# A sync message's largest body.  A report or a grant carries a window's store operations and
# replies of every rank the process hosts (a process of 6 569 nodes of the 24 576-accelerator
# cluster: 1.26 MB as its ranks connect), so it grows with the nodes per process, past the
# control channel's 1 MiB; only a peer that proved the fabric's secret gets this far.
MAX_SYNC_MESSAGE: Final = 256 << 20


def _nothing() -> None:
    pass


class SyncLink:
    """A sync connection once its handshake is done: the same length-prefixed msgpack as
    :class:`~rocev2_emu.control.channel.MessageChannel`, on the connection's socket directly.
    A window costs every process one report and one grant, and trio's scheduling passes
    around each were most of an exact run's time: a send here never yields (a report or a grant
    fits the socket buffer; a full one waits), a receive yields only when nothing is there."""

    def __init__(self, chan: MessageChannel) -> None:
        stream = chan.stream
        if not isinstance(stream, trio.SocketStream):
            raise TypeError("a sync link runs over a socket connection")
        self.chan = chan  # owns the connection (closed with it)
        self.sock = socket.socket(fileno=os.dup(stream.socket.fileno()))
        self.sock.setblocking(False)
        self._buf = chan.take_read_ahead()  # what the handshake read ahead
        self._chunk = bytearray(65536)  # what one read takes (no 64 KiB object per read)
        self._chunk_view = memoryview(self._chunk)
        self._poller = select.poll()  # for recv_blocking
        self._poller.register(self.sock, select.POLLIN)
        # the beats (computing): a thread, started by the first window; the lock keeps a beat
        # whole against the process's own next message
        self.beat_every = BEAT_SECONDS
        self._computing = False
        self._since = 0.0  # when this process last said something while computing
        self._beat_lock = threading.Lock()
        self._closed = threading.Event()
        self._beater: threading.Thread | None = None
        self._drain: tuple[int, Callable[[], None]] = (-1, _nothing)  # drain_with

    async def send(self, obj: Any) -> bool:
        """Send ``obj``; True if it had to wait for room (trio ran other tasks meanwhile)."""
        body = msgpack.packb(obj, use_bin_type=True)
        data = memoryview(LENGTH.pack(len(body)) + body)
        waited = False
        while data:
            try:
                sent = self.sock.send(data)
            except BlockingIOError:
                await trio.lowlevel.wait_writable(self.sock)
                waited = True
                continue
            except OSError as exc:
                raise ControlError(f"sync peer went away: {exc}") from exc
            data = data[sent:]
        return waited

    def _message(self) -> tuple[bool, Any]:
        """(True, the next whole message) if the buffer holds one, else (False, None)."""
        buf = self._buf
        if len(buf) >= LENGTH.size:
            (n,) = LENGTH.unpack_from(buf)
            if n > MAX_SYNC_MESSAGE:
                raise ControlError(f"a sync message of {n} bytes (> {MAX_SYNC_MESSAGE})")
            if len(buf) >= LENGTH.size + n:
                body = bytes(buf[LENGTH.size : LENGTH.size + n])
                del buf[: LENGTH.size + n]
                try:
                    return True, msgpack.unpackb(body, raw=False)
                except Exception as exc:  # msgpack raises several types
                    raise ControlError(f"malformed sync message: {exc}") from exc
        return False, None

    def _read(self) -> bool:
        """What the socket holds into the buffer; False if it held nothing yet."""
        try:
            n = self.sock.recv_into(self._chunk)
        except BlockingIOError:
            return False
        except OSError as exc:
            raise ControlError(f"sync peer went away: {exc}") from exc
        if not n:
            raise ControlError("sync peer closed the connection")
        self._buf += self._chunk_view[:n]
        return True

    async def recv(self) -> Any:
        while True:
            whole, msg = self._message()
            if whole:
                return msg
            if not self._read():
                await trio.lowlevel.wait_readable(self.sock)

    def drain_with(self, fd: int, drain: Callable[[], None]) -> None:
        """While :meth:`recv_blocking` waits, ``drain()`` whenever file ``fd`` is readable
        (a node process's link socket: the frames its peers send meanwhile)."""
        self._poller.register(fd, select.POLLIN)
        self._drain = (fd, drain)

    def watch(self, fd: int) -> None:
        """A file that interrupts :meth:`recv_blocking` when it becomes readable (a request
        for trio from another thread)."""
        self._poller.register(fd, select.POLLIN)

    def recv_blocking(self, timeout: float) -> tuple[bool, Any]:
        """(True, the next message) if one comes within ``timeout`` wall seconds, waiting in
        the kernel with trio standing still (no other task runs, nothing else is served
        meanwhile); (False, None) if none came, or a watched file became readable - the
        caller then waits in trio."""
        deadline = time.monotonic() + timeout
        mine = self.sock.fileno()
        while True:
            whole, msg = self._message()
            if whole:
                return True, msg
            if self._read():
                continue
            left = deadline - time.monotonic()
            ready = self._poller.poll(left * 1000.0) if left > 0 else []
            if not ready:
                return False, None  # the deadline passed
            drain_fd, drain = self._drain
            if any(fd == drain_fd for fd, _ in ready):
                drain()
            if any(fd != mine and fd != drain_fd for fd, _ in ready):
                return False, None  # a watched file: trio's turn

    # -- the beats ---------------------------------------------------------------------------
    def computing(self, on: bool) -> None:
        """This process computes a granted window from now on (``on``), or stops to report.
        While it computes, a thread sends :data:`BEAT` every :attr:`beat_every` wall seconds
        (the main thread is busy, not blocked: the thread runs between its bytecodes).  A
        process that is stopped, dead or stuck in native code sends none, and one that waits
        for frames or a grant is not computing: the coordinator's stall limit still finds it."""
        if on:
            self._since = time.monotonic()
            self._computing = True
            if self._beater is None:
                self._beater = threading.Thread(target=self._beat, name="sync-beat", daemon=True)
                self._beater.start()
        elif self._computing:
            with self._beat_lock:  # a beat being sent is whole before the report follows
                self._computing = False

    def _beat(self) -> None:
        frame = msgpack.packb(BEAT, use_bin_type=True)
        frame = LENGTH.pack(len(frame)) + frame
        writable = select.poll()
        writable.register(self.sock, select.POLLOUT)
        while not self._closed.wait(self.beat_every / 4):
            with self._beat_lock:
                if not self._computing or time.monotonic() - self._since < self.beat_every:
                    continue
                data = memoryview(frame)
                while data and not self._closed.is_set():
                    try:
                        data = data[self.sock.send(data) :]
                    except BlockingIOError:
                        writable.poll(1000.0)
                    except OSError:  # gone: the main thread hears it on its next message
                        return
                self._since = time.monotonic()

    async def aclose(self) -> None:
        self._closed.set()
        with self._beat_lock:  # no beat on a closed (perhaps reused) descriptor
            self.sock.close()
        await self.chan.aclose()
