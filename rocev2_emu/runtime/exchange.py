"""The frames of one process of an exact run to and from the others: each link whose far end
is in another process (:class:`RemoteLink`), and :class:`FrameExchange`, which sends what the
cores put on those links as UDP datagrams carrying the sync trailer
(:mod:`rocev2_emu.runtime.sync`) and puts what arrives on the heap at its arrival time, checked
(sender, VNI, sequence).  A datagram from an address that is no peer's is dropped and counted;
a gap or a bad trailer from a real peer stops the run.  It holds one entry per link and one
count per peer process, and the frames of one window until they are sent.
"""

from __future__ import annotations

import math
import sys
from typing import Final

from rocev2_emu.runtime.engine import EngineError
from rocev2_emu.runtime.events import Core, EventHeap, Node, Wire
from rocev2_emu.runtime.link import LinkFaults
from rocev2_emu.runtime.ports import UdpPort
from rocev2_emu.runtime.sync import split_trailer, with_trailer
from rocev2_emu.runtime.sync_messages import SyncError, process_label

STASH_EVERY: Final = 256  # datagrams sent between two looks at the socket (send_backlog)


def _rmem_max() -> str:
    """The system's largest socket receive buffer a process may ask for, as it says it."""
    try:
        with open("/proc/sys/net/core/rmem_max") as f:
            return f.read().strip()
    except OSError:
        return "unknown"


class RemoteLink:
    """A link from ``node``'s ``port`` to ``peer_name`` in another process, at ``peer``
    (its UDP address); ``vni`` names it in every datagram."""

    def __init__(
        self,
        node: Node,
        port: int,
        vni: int,
        peer_name: str,
        peer: tuple[str, int],
        faults: LinkFaults | None,
    ) -> None:
        self.node = node
        self.port = port
        self.vni = vni
        self.peer_name = peer_name
        self.peer = peer
        far = Node(peer_name, Core())  # stands for the far end; never on this heap
        self.wire = Wire(far, -1, faults)
        self.wire.outbox = []
        while len(node.wires) <= port:
            node.wires.append(None)
        node.wires[port] = self.wire
        self.expect = 1  # the next sequence number due from the far end
        self.name = f"{node.name} port {port} <- {process_label(peer_name)} (VNI {vni})"


class FrameExchange:
    """The remote links of process ``name`` over its UDP port ``udp``, frames arriving onto
    ``events`` (see the module)."""

    def __init__(self, name: str, udp: UdpPort, events: EventHeap) -> None:
        self.name = name
        self.udp = udp
        self.events = events
        self.links: list[RemoteLink] = []
        self._by_vni: dict[int, RemoteLink] = {}
        self._peers: set[tuple[str, int]] = set()  # the far ends' addresses, one per process
        self.strays = 0  # datagrams from addresses that are no peer's, dropped
        self.sent: dict[str, int] = {}  # frames sent to each other process
        self.received = 0
        self.received_from: dict[str, int] = {}  # frames received from each other process
        self._backlog: list[tuple[bytes, tuple[str, int]]] = []
        # datagrams taken off the socket while this process computed a window, for the next
        # pull, in arrival order (stash): at most what the others send it in one window
        self._stash: list[tuple[bytes, tuple[str, int]]] = []

    def link(self, link: RemoteLink) -> RemoteLink:
        if link.vni in self._by_vni:
            raise EngineError(f"two links with VNI {link.vni} in {self.name}")
        self.links.append(link)
        self._by_vni[link.vni] = link
        self._peers.add(link.peer)
        self.sent.setdefault(link.peer_name, 0)
        self.received_from.setdefault(link.peer_name, 0)
        return link

    def flush(self) -> float:
        """Take what the cores put on remote links (in order, per link) into the backlog to
        send; the earliest arrival among those frames (inf: none)."""
        backlog = self._backlog
        first = math.inf
        for link in self.links:
            outbox = link.wire.outbox
            if not outbox:
                continue
            for at, seq, data in outbox:
                backlog.append((with_trailer(data, at, seq), link.peer))
                if at < first:
                    first = at
            self.sent[link.peer_name] += len(outbox)
            outbox.clear()
        return first

    async def send_backlog(self) -> bool:
        """Send the frames for other processes; True if it had to wait for room.  Every
        :data:`STASH_EVERY` datagrams sent, the socket is emptied (:meth:`stash`): the others
        send their bursts at the same time, to a process that would not read while it sends."""
        backlog, udp = self._backlog, self.udp
        waited = False
        i = 0
        while i < len(backlog):
            data, peer = backlog[i]
            if udp.send_to(data, peer):
                i += 1
                if not i % STASH_EVERY:
                    self.stash()
            else:
                self.stash()
                await udp.wait_writable()
                waited = True
        backlog.clear()
        return waited

    def stash(self) -> None:
        """Every datagram the socket holds, copied aside in arrival order for the next
        :meth:`pull`.  A process computing a long window calls it now and then: its peers send
        while it computes, and a socket buffer that fills makes the kernel drop what does not
        fit - a frame of the run lost (the run then stops: :meth:`take_in`)."""
        udp, stash = self.udp, self._stash
        while (got := udp.recv_from()) is not None:
            data, sender = got
            stash.append((bytes(data), sender))

    def pull(self) -> None:
        """Every datagram stashed and then every one the socket holds, onto the heap
        (checked), in the order they arrived."""
        if self._stash:
            stash, self._stash = self._stash, []
            for data, sender in stash:
                self._take(data, sender)
        udp, take = self.udp, self._take
        while (got := udp.recv_from()) is not None:
            take(*got)

    def _take(self, data: bytes | memoryview, sender: tuple[str, int]) -> None:
        """One datagram from ``sender`` onto the heap, checked (see the module)."""
        vni = data[4] << 16 | data[5] << 8 | data[6] if len(data) >= 8 else -1
        link = self._by_vni.get(vni)
        if link is None or sender != link.peer:
            if sender not in self._peers:  # a stranger's: dropped and counted
                self._stray(sender)
                return
            raise SyncError(
                f"{process_label(self.name)}: a datagram from {sender[0]}:{sender[1]} with VNI "
                f"{vni} is on no link of this node"
            )
        try:
            frame, at, seq = split_trailer(data)
        except ValueError as exc:
            raise SyncError(f"link {link.name}: {exc}") from exc
        if seq != link.expect:
            gap = f"link {link.name}: frame {seq} came when {link.expect} was due"
            self._check_lost({}, gap)  # the kernel dropped it: say so, and what to raise
            raise SyncError(
                f"{gap} (a datagram was lost or reordered between processes); the run stops"
            )
        link.expect += 1
        self.received += 1
        self.received_from[link.peer_name] += 1
        self.events.arrive(link.node, link.port, at, seq, frame)

    def _stray(self, sender: tuple[str, int]) -> None:
        """A datagram from an address that is no peer of this process: not the run's (only
        root could send from a peer's bound address), so it is dropped and counted - the run
        goes on, as a switch drops a frame from a stranger.  Said on stderr at the first and
        then at every power of two."""
        self.strays += 1
        if self.strays & (self.strays - 1) == 0:
            print(
                f"rocev2-emu: {process_label(self.name)}: dropped a datagram from "
                f"{sender[0]}:{sender[1]}, no peer of this node ({self.strays} so far)",
                file=sys.stderr,
                flush=True,
            )

    async def take_in(self, expect: dict[str, int]) -> bool:
        """Until every frame the others sent this process is on the heap (``expect``: how many
        each other process has sent it so far, the grant's); True if it had to wait for one
        (they are usually there: each was sent before its sender reported)."""
        self.pull()
        got = self.received_from
        waited = False
        while any(got.get(sender, 0) < n for sender, n in expect.items()):
            self._check_lost(expect)
            await self.udp.wait_readable()
            waited = True
            self.pull()
        return waited

    def _check_lost(self, expect: dict[str, int], gap: str = "") -> None:
        """Frames the others sent are not here (``expect``: how many each sent), or a link's
        frames came with a ``gap``: if the kernel dropped datagrams on this process's port
        (its receive buffer was full), they never will - a SyncError that says so and what
        to raise, rather than a wait until the coordinator's stall limit.  (On one machine a
        datagram sent is in the receiver's buffer when its sender reports; across machines it
        may still be on its way.)"""
        drops = self.udp.kernel_drops()
        if drops:
            lost = gap or ", ".join(
                f"from {process_label(sender)}: {self.received_from.get(sender, 0)} of {n} received"
                for sender, n in sorted(expect.items())
                if self.received_from.get(sender, 0) < n
            )
            raise SyncError(
                f"{process_label(self.name)}: the kernel dropped {drops} datagrams on this "
                f"process's port (its receive buffer was full): frames of the run are lost "
                f"({lost}); the run stops.  A window's frames from one process come in one "
                "burst: give the socket more room (net.core.rmem_max, now "
                f"{_rmem_max()} bytes: sysctl -w net.core.rmem_max=268435456) or the run "
                "more --workers"
            )
