"""An in-memory datagram network for tests: :class:`MemoryPort` is a
:class:`~rocev2_emu.runtime.ports.DatagramPort` without sockets (the virtual-time fabric runs on
the event engine instead).  Lossless up to a queue limit a port, past which it counts
``rx_overflow`` as a socket counts its kernel drops.  Grows with the datagrams queued."""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

import trio


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

    def send_batch(
        self, datagrams: Sequence[bytes | bytearray], peer: tuple[str, int] | None = None
    ) -> int:
        for d in datagrams:
            if peer is None:
                self.send(d)
            else:
                self.send_to(d, peer)
        return len(datagrams)

    def kernel_drops(self) -> int:
        return self.rx_overflow

    async def wait_readable(self) -> None:
        if not self.inbox:
            await self._lot.park()

    async def wait_writable(self) -> None:
        await trio.lowlevel.checkpoint()

    def close(self) -> None:
        self.net.ports.pop(self.address, None)
