"""Datagram ports a driver pumps: a real UDP socket, or an in-memory one for tests
(:mod:`rocev2_emu.runtime.memory_ports`).

Both are non-blocking and batch-friendly, as DESIGN.md's measurements demand: ``recv`` returns
one datagram or None when nothing is queued (the UDP port reuses one preallocated buffer, so the
view is valid until the next call), ``send`` returns False instead of blocking, and the
``wait_*`` coroutines are the only places a driver sleeps.

Batched I/O (Linux UDP GSO and GRO, from the standard library alone): ``send_batch`` hands the
kernel a run of equal-size datagrams in one ``sendmsg`` with a ``UDP_SEGMENT`` control message,
and a socket with ``UDP_GRO`` on receives runs of them coalesced, which ``recv`` splits by the
segment size the kernel reports.  Each datagram is still one frame on the emulated link (a
capture of the socket traffic, ``tshark -i lo``, sees the coalesced datagrams; ``--pcap`` files
do not).  Where the kernel, the socket or the path refuses either (a GSO segment above the MTU
of a container bridge), the port falls back to one datagram per call and says so
(:attr:`UdpPort.batch_mode`).
"""

from __future__ import annotations

import errno
import os
import socket
import struct
import sys
from collections import deque
from collections.abc import Sequence
from typing import Final, Protocol

import trio

RECV_BUFFER: Final = 65536
SOCKET_BUFFER: Final = 8 << 20
# linux/udp.h: not in Python's socket module
SOL_UDP: Final = 17
UDP_SEGMENT: Final = 103
UDP_GRO: Final = 104
MAX_SEGMENTS: Final = 64  # UDP_MAX_SEGMENTS
MAX_GSO_BYTES: Final = 65000  # one GSO send stays one IP datagram's worth (65 507)
BATCH_IO_ENV: Final = "ROCEV2_EMU_BATCH_IO"  # "0": no batched I/O in this process tree


def batch_io_allowed() -> bool:
    """Whether this process may batch (``--no-batch-io`` sets ROCEV2_EMU_BATCH_IO=0 for the
    command and the node processes it starts)."""
    return os.environ.get(BATCH_IO_ENV, "1") != "0"


def batch_mode(port: object) -> str:
    """The batched I/O a port runs (``gso+gro``, ``gso``, ``gro``, ``off``; only UDP ports
    batch)."""
    mode = getattr(port, "batch_mode", "off")
    return mode if isinstance(mode, str) else "off"


# What a GSO send answers where this socket's path cannot take it: no GSO there (EIO, EINVAL,
# ENOPROTOOPT, EOPNOTSUPP), or a segment larger than the path's MTU (EMSGSIZE from Linux 6.x,
# EINVAL before) - a container bridge's 1 500 bytes against a 4 162-byte frame.  One datagram per
# call from then on: the kernel fragments each as it always did.  Any other error is the
# datagrams' own (a refused peer) and counted.
_NO_GSO: Final = frozenset(
    (errno.EIO, errno.EINVAL, errno.ENOPROTOOPT, errno.EOPNOTSUPP, errno.EMSGSIZE)
)
_GSO_SIZE = struct.Struct("=H")
_GRO_SIZE = struct.Struct("=i")
SO_MEMINFO: Final = 55  # linux/socket.h: the socket's memory figures, u32 each (sock_diag.h)
SK_MEMINFO_DROPS: Final = 8  # their ninth: datagrams dropped (the sk_drops counter)
_MEMINFO = struct.Struct("=9I")


class PortInfo(Protocol):
    """What a NIC's owner reads of its port: its addresses and its drops."""

    peer: tuple[str, int] | None
    address: tuple[str, int]

    def kernel_drops(self) -> int: ...

    def close(self) -> None: ...


class DatagramPort(PortInfo, Protocol):
    tx_errors: int

    def recv(self) -> memoryview | bytes | None: ...

    def recv_from(self) -> tuple[memoryview | bytes, tuple[str, int]] | None: ...

    def send(self, data: bytes | bytearray | memoryview) -> bool: ...

    def send_to(self, data: bytes | bytearray | memoryview, peer: tuple[str, int]) -> bool: ...

    def send_batch(
        self, datagrams: Sequence[bytes | bytearray], peer: tuple[str, int] | None = None
    ) -> int: ...

    async def wait_readable(self) -> None: ...

    async def wait_writable(self) -> None: ...


def kernel_drops(sock: socket.socket) -> int | None:
    """Datagrams the kernel dropped for this socket (receive buffer full): Linux's
    ``SO_MEMINFO`` (one system call), else the ``drops`` column of /proc/net/udp (a read that
    grows with the machine's sockets); None where neither exists.  Emulated frames must never
    vanish silently, and this is where they would."""
    if sys.platform == "linux":
        try:
            info = sock.getsockopt(socket.SOL_SOCKET, SO_MEMINFO, _MEMINFO.size)
            return int(_MEMINFO.unpack(info)[SK_MEMINFO_DROPS])
        except (OSError, struct.error):
            pass
    try:
        inode = os.fstat(sock.fileno()).st_ino
        with open("/proc/net/udp") as f:
            for line in f:
                fields = line.split()
                if len(fields) > 12 and fields[9] == str(inode):
                    return int(fields[-1])
    except (OSError, ValueError):
        return None
    return 0


class UdpPort:
    """A UDP socket bound to this node's address (127.0.0.N locally), sending to one peer.
    ``batch``: use GSO and GRO where the kernel has them (see the module's docstring)."""

    def __init__(
        self,
        bind: tuple[str, int],
        peer: tuple[str, int] | None = None,
        *,
        batch: bool = True,
        receive_buffer: int = SOCKET_BUFFER,
    ) -> None:
        """``receive_buffer``: bytes the kernel may hold for it; above ``net.core.rmem_max``
        only where the process may force it (CAP_NET_ADMIN), else that maximum."""
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SOCKET_BUFFER)
            self._receive_buffer(receive_buffer)
            self.sock.bind(bind)
        except OSError as exc:
            self.sock.close()
            raise OSError(
                exc.errno, f"cannot bind the NIC's UDP port {bind[0]}:{bind[1]}: {exc.strerror}"
            ) from exc
        self.sock.setblocking(False)
        self.address: tuple[str, int] = self.sock.getsockname()
        self._peer: tuple[str, int] | None = None
        self.peer = peer
        self.tx_errors = 0
        self._buf = bytearray(RECV_BUFFER)
        self._view = memoryview(self._buf)
        batch = batch and batch_io_allowed()
        self.gso = batch and sys.platform == "linux"  # until a send with UDP_SEGMENT fails
        self.gro = batch and self._enable_gro()
        self.gso_sends = self.gro_reads = 0  # batched system calls, for the metrics
        self._split: deque[memoryview] = deque()  # segments of a coalesced read, still to hand
        self._split_from: tuple[str, int] = ("", 0)
        self._anc = socket.CMSG_SPACE(_GRO_SIZE.size)

    def _receive_buffer(self, size: int) -> None:
        force = getattr(socket, "SO_RCVBUFFORCE", None)
        if size > SOCKET_BUFFER and force is not None:
            try:
                self.sock.setsockopt(socket.SOL_SOCKET, force, size)
                return
            except OSError:  # not privileged: the system's maximum
                pass
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, size)

    def _enable_gro(self) -> bool:
        if sys.platform != "linux":
            return False
        try:
            self.sock.setsockopt(SOL_UDP, UDP_GRO, 1)
        except OSError:
            return False
        return True

    @property
    def batch_mode(self) -> str:
        """Which batched I/O runs: ``gso+gro``, ``gso``, ``gro`` or ``off``."""
        modes = [m for m, on in (("gso", self.gso), ("gro", self.gro)) if on]
        return "+".join(modes) or "off"

    @property
    def peer(self) -> tuple[str, int] | None:
        return self._peer

    @peer.setter
    def peer(self, peer: tuple[str, int] | None) -> None:
        # A connected UDP socket skips the per-datagram address conversion and route lookup
        # (2-4 µs a packet here) and accepts datagrams from the link's peer only.
        self._peer = peer
        if peer is not None:
            self.sock.connect(peer)

    def recv(self) -> memoryview | None:
        if self.gro:
            got = self.recv_from()
            return None if got is None else got[0]
        try:
            n = self.sock.recv_into(self._buf)
        except (BlockingIOError, InterruptedError):
            return None
        except ConnectionRefusedError:  # ICMP port unreachable from a dead peer
            return None
        return self._view[:n]

    def recv_from(self) -> tuple[memoryview, tuple[str, int]] | None:
        """One datagram and its sender (an unconnected socket: a switch's, shared by its ports)."""
        if self._split:
            return self._split.popleft(), self._split_from
        if not self.gro:
            try:
                n, sender = self.sock.recvfrom_into(self._buf)
            except (BlockingIOError, InterruptedError, ConnectionRefusedError):
                return None
            return self._view[:n], sender
        try:
            n, ancdata, _flags, sender = self.sock.recvmsg_into([self._buf], self._anc)
        except (BlockingIOError, InterruptedError, ConnectionRefusedError):
            return None
        segment = n
        for level, kind, data in ancdata:
            if level == SOL_UDP and kind == UDP_GRO and len(data) >= _GRO_SIZE.size:
                segment = _GRO_SIZE.unpack_from(data)[0]
        view = self._view
        if 0 < segment < n:  # coalesced: hand the segments out one by one (the buffer waits)
            self.gro_reads += 1
            self._split.extend(view[i : min(i + segment, n)] for i in range(segment, n, segment))
            self._split_from = sender
            return view[:segment], sender
        return view[:n], sender

    def send(self, data: bytes | bytearray | memoryview) -> bool:
        if self._peer is None:
            self.tx_errors += 1
            return True
        try:
            self.sock.send(data)
        except BlockingIOError:
            return False
        except OSError:
            self.tx_errors += 1  # e.g. ECONNREFUSED surfaced from an earlier ICMP error
        return True

    def send_to(self, data: bytes | bytearray | memoryview, peer: tuple[str, int]) -> bool:
        """Send to one of several peers (a switch's ports share one unconnected socket)."""
        try:
            self.sock.sendto(data, peer)
        except BlockingIOError:
            return False
        except OSError:
            self.tx_errors += 1
        return True

    def send_batch(
        self, datagrams: Sequence[bytes | bytearray], peer: tuple[str, int] | None = None
    ) -> int:
        """Send ``datagrams`` in order, to ``peer`` or the connected one: runs of equal size
        (a shorter one may end a run) in one GSO ``sendmsg`` each.  How many left: fewer than
        all only when the socket would block."""
        if not self.gso:
            return self._send_each(datagrams, 0, len(datagrams), peer)
        i, count = 0, len(datagrams)
        while i < count:
            segment = len(datagrams[i])
            j, total = i, 0
            while j < count and j - i < MAX_SEGMENTS:
                size = len(datagrams[j])
                if size > segment or total + size > MAX_GSO_BYTES:
                    break
                total += size
                j += 1
                if size < segment:
                    break  # a shorter datagram can only be a run's last
            if j - i == 1:
                if self._send_each(datagrams, i, j, peer) == i:
                    return i
                i = j
                continue
            cmsg = [(SOL_UDP, UDP_SEGMENT, _GSO_SIZE.pack(segment))]
            try:
                if peer is None:
                    self.sock.sendmsg(datagrams[i:j], cmsg)  # gathered by the kernel
                else:
                    self.sock.sendmsg(datagrams[i:j], cmsg, 0, peer)
            except BlockingIOError:
                return i
            except OSError as exc:
                if exc.errno in _NO_GSO:
                    self.gso = False  # this socket's path cannot segment: one by one from now
                    return self._send_each(datagrams, i, count, peer)
                self.tx_errors += 1  # e.g. ECONNREFUSED from an earlier ICMP error
            else:
                self.gso_sends += 1
            i = j
        return count

    def _send_each(
        self,
        datagrams: Sequence[bytes | bytearray],
        start: int,
        end: int,
        peer: tuple[str, int] | None,
    ) -> int:
        for i in range(start, end):
            sent = self.send(datagrams[i]) if peer is None else self.send_to(datagrams[i], peer)
            if not sent:
                return i
        return end

    async def wait_readable(self) -> None:
        await trio.lowlevel.wait_readable(self.sock)

    async def wait_writable(self) -> None:
        await trio.lowlevel.wait_writable(self.sock)

    def kernel_drops(self) -> int:
        return kernel_drops(self.sock) or 0

    def close(self) -> None:
        self.sock.close()


class EnginePort:
    """A node's address in virtual time, where the event engine (not a port) carries frames:
    nothing queues here, so nothing can be dropped here."""

    def __init__(self, address: tuple[str, int], peer: tuple[str, int] | None) -> None:
        self.address = address
        self.peer = peer

    def kernel_drops(self) -> int:
        return 0

    def close(self) -> None:
        """Nothing to release: the engine owns the links."""
