"""Datagram ports a driver pumps: a real UDP socket, or an in-memory one for tests.

Both are non-blocking and batch-friendly, as DESIGN.md's measurements demand: ``recv`` returns
one datagram or None when nothing is queued (the UDP port reuses one preallocated buffer, so the
view is valid until the next call), ``send`` returns False instead of blocking, and the
``wait_*`` coroutines are the only places a driver sleeps.
"""

from __future__ import annotations

import os
import socket
from collections import deque
from typing import Final, Protocol

import trio

RECV_BUFFER: Final = 65536
SOCKET_BUFFER: Final = 8 << 20


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

    async def wait_readable(self) -> None: ...

    async def wait_writable(self) -> None: ...


def kernel_drops(sock: socket.socket) -> int | None:
    """Datagrams the kernel dropped for this socket (receive buffer full), from the ``drops``
    column of /proc/net/udp; None where that file does not exist.  Emulated frames must never
    vanish silently, and this is where they would."""
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
    """A UDP socket bound to this node's address (127.0.0.N locally), sending to one peer."""

    def __init__(self, bind: tuple[str, int], peer: tuple[str, int] | None = None) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            for opt in (socket.SO_RCVBUF, socket.SO_SNDBUF):
                self.sock.setsockopt(socket.SOL_SOCKET, opt, SOCKET_BUFFER)
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
        try:
            n = self.sock.recv_into(self._buf)
        except (BlockingIOError, InterruptedError):
            return None
        except ConnectionRefusedError:  # ICMP port unreachable from a dead peer
            return None
        return self._view[:n]

    def recv_from(self) -> tuple[memoryview, tuple[str, int]] | None:
        """One datagram and its sender (an unconnected socket: a switch's, shared by its ports)."""
        try:
            n, sender = self.sock.recvfrom_into(self._buf)
        except (BlockingIOError, InterruptedError, ConnectionRefusedError):
            return None
        return self._view[:n], sender

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

    async def wait_readable(self) -> None:
        await trio.lowlevel.wait_readable(self.sock)

    async def wait_writable(self) -> None:
        await trio.lowlevel.wait_writable(self.sock)

    def kernel_drops(self) -> int:
        return kernel_drops(self.sock) or 0

    def close(self) -> None:
        self.sock.close()


class MemoryNetwork:
    """A lossless in-memory wire between MemoryPorts: the pump without sockets, for tests (the
    virtual-time fabric runs on the event engine instead, :mod:`rocev2_emu.runtime.engine`)."""

    def __init__(self, queue_limit: int = 1 << 16) -> None:
        self.ports: dict[tuple[str, int], MemoryPort] = {}
        self.queue_limit = queue_limit

    def port(self, address: tuple[str, int], peer: tuple[str, int] | None = None) -> MemoryPort:
        if address in self.ports:
            raise OSError(f"address {address} already in use on the memory network")
        p = MemoryPort(self, address, peer)
        self.ports[address] = p
        return p


class MemoryPort:
    def __init__(
        self, net: MemoryNetwork, address: tuple[str, int], peer: tuple[str, int] | None
    ) -> None:
        self.net = net
        self.address = address
        self.peer = peer
        self.tx_errors = 0
        self.rx_overflow = 0
        self.inbox: deque[tuple[bytes, tuple[str, int]]] = deque()  # datagram, its sender
        self._lot = trio.lowlevel.ParkingLot()

    def recv(self) -> bytes | None:
        return self.inbox.popleft()[0] if self.inbox else None

    def recv_from(self) -> tuple[bytes, tuple[str, int]] | None:
        return self.inbox.popleft() if self.inbox else None

    def send(self, data: bytes | bytearray | memoryview) -> bool:
        return self.send_to(data, self.peer) if self.peer is not None else self._no_peer()

    def _no_peer(self) -> bool:
        self.tx_errors += 1
        return True

    def send_to(self, data: bytes | bytearray | memoryview, peer: tuple[str, int]) -> bool:
        dst = self.net.ports.get(peer)
        if dst is None:
            self.tx_errors += 1
            return True
        if len(dst.inbox) >= self.net.queue_limit:
            dst.rx_overflow += 1
            return True
        dst.inbox.append((bytes(data), self.address))
        dst._lot.unpark_all()
        return True

    def kernel_drops(self) -> int:
        return self.rx_overflow

    async def wait_readable(self) -> None:
        if not self.inbox:
            await self._lot.park()

    async def wait_writable(self) -> None:
        await trio.lowlevel.checkpoint()

    def close(self) -> None:
        self.net.ports.pop(self.address, None)


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
