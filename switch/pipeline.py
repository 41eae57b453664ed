"""The switch pipeline (sans-IO): ingress, forwarding with ECMP, buffer admission, egress
queues per port and priority, ECN marking, PFC generation and reaction, and the PFC watchdog.

Per frame: decode the VXLAN/Ethernet/IPv4 headers (bad checksum, TTL expired, no route are
counted drops); take the forwarding decision (:mod:`switch.forwarding`: the egress port among
the equal-cost ones by ECMP, the priority by DSCP, the TTL decremented); ask the MMU
(:mod:`switch.mmu`) for room - lossless priorities pause the upstream port with 802.1Qbb
frames, lossy ones tail-drop; rewrite MACs; queue.  Each egress port drains at its line rate,
strict priority between classes, skipping a priority while the neighbour pauses it.  At
dequeue, RED on the queue's depth marks CE on ECT packets (never on non-ECT:
:class:`~switch.forwarding.EcnMarker`).  Every time is
emulated seconds.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Final

from rocev2_emu.runtime.events import Core
from rocev2_emu.wire.errors import MalformedFrame
from rocev2_emu.wire.ethernet import (
    ETH_HEADER,
    ETHERTYPE_IPV4,
    ETHERTYPE_MAC_CONTROL,
    VXLAN_FLAG_I,
    VXLAN_HEADER,
    VXLAN_LEN,
    ipv4_checksum,
    wire_len,
)
from rocev2_emu.wire.linerate import NOMINAL_BPS
from rocev2_emu.wire.pfc import decode_pfc_untrusted, encode_pfc, pause_time
from rocev2_emu.wire.qos import PRIORITIES
from switch.config import SwitchConfig
from switch.forwarding import IP as _IP
from switch.forwarding import EcnMarker, Forwarding
from switch.mmu import ADMIT_DROP, ADMIT_HEADROOM, Mmu
from switch.port_state import Fifo, PortState, QueueEntry
from switch.watchdog import Watchdog

_ELIDED_MIN: Final = _IP + 20 + 8 + 12  # a timing-only frame: IPv4, UDP and BTH at least


class SwitchCore(Core):
    """One switch: its ports, buffer, queues, PFC and ECN, driven through the four methods of
    :class:`~rocev2_emu.runtime.events.Core`."""

    def __init__(self, config: SwitchConfig) -> None:
        self.config = config
        self.ports = [PortState(p.rate_bps) for p in config.ports]
        self._paused_until = [ps.paused_until for ps in self.ports]  # the watchdog reads them
        self.by_vni = {p.vni: p.index for p in config.ports}
        lossless = config.lossless if config.pfc_enabled else frozenset()
        headrooms = [p.headroom_bytes for p in config.ports]
        self.mmu = Mmu(config.mmu, len(config.ports), lossless, headrooms)
        self.watchdog = Watchdog(len(config.ports), config.watchdog_detect, config.watchdog_restore)
        self.marker = EcnMarker(config, self.ports)
        self.forwarding = Forwarding(config, self.ports)
        self._valid_ip = self.forwarding.valid_ip  # (its memo, read inline per frame)
        self._watchdog_drops = config.watchdog_action == "drop"  # else "forward"
        self._elide = config.timing_only
        # ports with frames to send: the set next_out's sweep turns over (its order is the
        # order ports take their turns) and the same ports as a list the timer reads
        self._pending: set[int] = set()
        self._pending_ports: list[PortState] = []
        # next_out's turn over the pending ports, and where it is; the turn is the set's order,
        # made again only when the set changed since (a set's order is its history's)
        self._sweep: list[int] = []
        self._pending_changed = False
        self._spare: list[Fifo] = []  # emptied FIFOs, reused (queues are mostly short)
        # entries of frames sent, refilled for the next frames queued (no allocation a frame):
        # at most as many as the switch once held at a time, each holding no frame
        self._spare_entries: list[QueueEntry] = []
        self._sweep_at = 0
        self._refreshing: set[int] = set()  # ports with an XOFF to refresh
        # no refresh is due before this (the earliest, or earlier: then the look finds none)
        self._refresh_next = math.inf
        self._prefix = [
            VXLAN_HEADER.pack(VXLAN_FLAG_I, p.vni << 8)
            + ETH_HEADER.pack(p.peer_mac, p.mac, ETHERTYPE_IPV4)
            for p in config.ports
        ]
        self.drops: Counter[str] = Counter()  # drops before an ingress port is known

    @property
    def catchup(self) -> float:
        """Emulated seconds a late pump may send in the past (the driver sets it)."""
        return self.ports[0].pacer.catchup if self.ports else 0.0

    @catchup.setter
    def catchup(self, seconds: float) -> None:
        for ps in self.ports:
            ps.pacer.catchup = seconds

    @property
    def behind_schedule(self) -> int:
        """Frames that lost their line-rate slot, over every port."""
        return sum(ps.pacer.behind_schedule for ps in self.ports)

    # -- ingress ---------------------------------------------------------------------------
    def receive(self, port: int, data: bytes, now: float) -> None:
        """One VXLAN datagram arrived on ``port``.  Never raises for bad input: counts it."""
        ps = self.ports[port]
        ps.rx_packets += 1
        # a runt counts as a packet, not as bytes; an elided frame (timing-only) as a whole one
        ps.rx_bytes += wire_len(data) if self._elide else max(0, len(data) - VXLAN_LEN)
        if not ps.up:
            ps.drops["link_down"] += 1
            return
        if len(data) < _IP + 20 or not data[0] & VXLAN_FLAG_I:
            ps.drops["malformed"] += 1
            return
        ethertype = data[20] << 8 | data[21]
        if ethertype == ETHERTYPE_MAC_CONTROL:
            self._on_pfc(port, data, now)
            return
        if ethertype != ETHERTYPE_IPV4:
            ps.drops["ethertype"] += 1
            return
        if type(data) is not bytes:  # a bytearray's slice would not do as a memo key
            data = bytes(data)
        header = data[_IP : _IP + 20]
        known = self._valid_ip.get(header)
        if known is None:
            if header[0] != 0x45 or ipv4_checksum(header) != 0:
                ps.drops["ipv4_checksum"] += 1
                return
            known = self.forwarding.learn(header)
        rewritten, prio, ports = known
        total = header[2] << 8 | header[3]
        if total < 20 or (
            _IP + total > len(data)  # shorter than its own header, or cut - or, in a timing-only
            and not (self._elide and len(data) >= _ELIDED_MIN)  # run, a frame's headers
        ):
            ps.drops["malformed"] += 1
            return
        ttl = header[8]
        if ttl <= 1:
            ps.drops["ttl"] += 1
            return
        if len(ports) == 1 and self.ports[ports[0]].up:
            out: int | None = ports[0]
        else:
            out = self.forwarding.ecmp(header, data, ports)
        if out is None:
            ps.drops["no_route"] += 1
            return
        size = total + 14
        eq = self.ports[out]
        if self.watchdog.stormed[out][prio] and self._watchdog_drops:
            eq.drops["pfc_watchdog"] += 1
            return
        mmu = self.mmu
        where = mmu.admit_enqueue(port, prio, size)
        if where == ADMIT_DROP:
            ps.drops["headroom" if mmu.lossless_mask >> prio & 1 else "buffer"] += 1
            return
        from_headroom = where == ADMIT_HEADROOM
        datagram = b"".join((self._prefix[out], rewritten, data[_IP + 20 : _IP + total]))
        entries = self._spare_entries
        if entries:
            e = entries.pop()
            e.datagram = datagram
            e.in_port = port
            e.size = size
            e.from_headroom = from_headroom
        else:
            e = QueueEntry(datagram, port, size, from_headroom)
        eq.queues[prio].push(port, e, self._spare)
        queue_bytes = eq.queue_bytes  # (not +=: mypyc adds a list's item as an object)
        depth = queue_bytes[prio] + size
        queue_bytes[prio] = depth
        eq.queued |= 1 << prio
        if depth > eq.peak_queue_bytes:
            eq.peak_queue_bytes = depth
        if eq.pending < 0:
            self._queue_on(out, eq)
        if mmu.lossless_mask >> prio & 1 and mmu.should_pause(port, prio):
            self._send_pfc(port, prio, self.config.pfc_quanta, now)

    def _on_pfc(self, port: int, data: bytes | bytearray | memoryview, now: float) -> None:
        ps = self.ports[port]
        try:
            frame = decode_pfc_untrusted(memoryview(data)[VXLAN_LEN:])
        except MalformedFrame as exc:
            ps.drops[exc.reason] += 1
            return
        rate = self.config.ports[port].rate_bps or NOMINAL_BPS
        if not frame.class_enable & 0xFF:  # pauses nothing: counted, not ignored silently
            ps.drops["pfc_no_class_enabled"] += 1
            return
        for prio in range(PRIORITIES):
            if frame.class_enable >> prio & 1:
                ps.pfc_rx[prio] += 1
                quanta = frame.quanta[prio]
                self.watchdog.pause_seen(port, prio, now, quanta > 0, ps.paused_until[prio] > now)
                if self.watchdog.stormed[port][prio]:
                    continue  # a stormed queue no longer honours pauses
                ps.pause(prio, now + pause_time(quanta, rate), now)

    def _send_pfc(self, port: int, prio: int, quanta: int, now: float) -> None:
        """XOFF (quanta > 0) or XON (0) for ``prio`` to the neighbour on ``port``."""
        cfg = self.config.ports[port]
        ps = self.ports[port]
        self.mmu.paused[port][prio] = quanta > 0
        frame = encode_pfc(cfg.mac, {prio: quanta})
        ps.control.append(VXLAN_HEADER.pack(VXLAN_FLAG_I, cfg.vni << 8) + frame)
        if ps.pending < 0:
            self._queue_on(port, ps)
        ps.pfc_tx[prio] += 1
        if quanta:
            rate = cfg.rate_bps or NOMINAL_BPS
            refresh = ps.xoff_refresh_at[prio] = now + pause_time(quanta, rate) / 2
            if refresh < self._refresh_next:
                self._refresh_next = refresh
            self._refreshing.add(port)
        else:
            ps.xoff_refresh_at[prio] = 0.0

    # -- egress ----------------------------------------------------------------------------
    def next_out(self, now: float) -> tuple[int, bytes] | None:
        """The next datagram due to leave by ``now``, as (port, datagram), or None.  One sweep
        over the ports with frames queued, in turn, each drained while its pacer lets it; what
        the caller does not take stays queued (a blocked socket), and the sweep resumes there."""
        sweep = self._sweep
        if self._sweep_at >= len(sweep):  # a new turn (the last one's order, if still true)
            if self._pending_changed:
                self._pending_changed = False
                sweep.clear()
                for index in self._pending:  # (compiled, a list.extend copies the set first)
                    sweep.append(index)
            if not sweep:
                return None
            self._sweep_at = 0
        while self._sweep_at < len(sweep):
            index = sweep[self._sweep_at]
            ps = self.ports[index]
            pacer = ps.pacer
            if not pacer.rate_bps or pacer.free_at <= now:  # LinePacer.ready, inline
                datagram = self._dequeue(index, ps, now)
                if datagram is not None:
                    size = wire_len(datagram) if self._elide else len(datagram) - VXLAN_LEN
                    ps.tx_packets += 1
                    ps.tx_bytes += size
                    pacer.depart(size, now)
                    if ps.up:
                        return index, datagram
                    ps.drops["link_down"] += 1
                    continue
                pacer.idle = True
                if not ps.control and not ps.queued and ps.pending >= 0:
                    self._queue_off(index, ps)
            self._sweep_at += 1
        return None

    def _queue_on(self, index: int, ps: PortState) -> None:
        """Port ``index`` has frames to send (it had none)."""
        ps.pending = len(self._pending_ports)
        self._pending_ports.append(ps)
        self._pending.add(index)
        self._pending_changed = True

    def _queue_off(self, index: int, ps: PortState) -> None:
        """Port ``index`` has nothing left to send."""
        ports = self._pending_ports
        last = ports.pop()
        if last is not ps:
            ports[ps.pending] = last
            last.pending = ps.pending
        ps.pending = -1
        self._pending.discard(index)
        self._pending_changed = True

    def _dequeue(self, index: int, ps: PortState, now: float) -> bytes | None:
        if ps.control:
            return ps.control.pop(0)
        queued = ps.queued
        stormed = self.watchdog.stormed[index]
        for prio in range(PRIORITIES - 1, -1, -1):
            if not queued >> prio & 1 or (ps.paused_until[prio] > now and not stormed[prio]):
                continue
            q = ps.queues[prio]
            # Ingress ports take turns within a priority, as switch arbiters do: this is what
            # makes PFC fair to ports rather than to flows (the DCQCN paper's unfairness).
            e = q.pop(self._spare)
            if q.empty():
                ps.queued = queued & ~(1 << prio)
            queue_bytes = ps.queue_bytes
            depth = queue_bytes[prio]  # the depth RED reads: the frame's own bytes still in it
            queue_bytes[prio] = depth - e.size
            self._release(e, prio, now)
            datagram = e.datagram
            e.datagram = b""
            self._spare_entries.append(e)
            return self.marker.mark(index, prio, datagram, depth)
        return None

    def _release(self, e: QueueEntry, prio: int, now: float) -> None:
        mmu = self.mmu
        mmu.dequeue(e.in_port, prio, e.size, e.from_headroom)
        if mmu.paused[e.in_port][prio] and mmu.should_resume(e.in_port, prio):
            self._send_pfc(e.in_port, prio, 0, now)

    # -- timers, links ---------------------------------------------------------------------
    def get_timer(self) -> float | None:
        """The next time :meth:`next_out` or :meth:`handle_timer` has work: only ports with
        frames queued and ports refreshing an XOFF are looked at, not every port.  (A native
        float with a flag for "none yet": a ``float | None`` is boxed at every assignment.)"""
        w = self.watchdog.get_timer()
        has_t = w is not None
        t = w if w is not None else 0.0
        for ps in self._pending_ports:
            free_at = ps.pacer.free_at
            if ps.control:
                at = free_at
            else:
                at = math.inf
                paused_until, queued, prio = ps.paused_until, ps.queued, 0
                while queued:
                    if queued & 1:
                        p = paused_until[prio]
                        q = free_at if free_at > p else p
                        if q < at:
                            at = q
                    queued >>= 1
                    prio += 1
                if at == math.inf:
                    continue
            if not has_t or at < t:
                t = at
                has_t = True
        if self._refreshing:  # (most looks: an empty set's iterator is not free)
            for index in self._refreshing:
                for r in self.ports[index].xoff_refresh_at:
                    if r and (not has_t or r < t):
                        t = r
                        has_t = True
        return t if has_t else None

    def handle_timer(self, now: float) -> None:
        if self._refreshing and now >= self._refresh_next:
            self._refresh_next = math.inf  # what stays, and each refresh sent, lowers it again
            for index in sorted(self._refreshing):
                ps = self.ports[index]
                for prio in range(PRIORITIES):
                    t = ps.xoff_refresh_at[prio]
                    if t and t <= now:
                        if self.mmu.paused[index][prio]:
                            self._send_pfc(index, prio, self.config.pfc_quanta, now)  # refresh
                        else:
                            ps.xoff_refresh_at[prio] = 0.0
                    t = ps.xoff_refresh_at[prio]
                    if t and t < self._refresh_next:
                        self._refresh_next = t
                if not any(ps.xoff_refresh_at):
                    self._refreshing.discard(index)
        if not self.watchdog.watching:
            return
        for port, prio in self.watchdog.check(now, self._paused_until):
            ps = self.ports[port]
            if self.watchdog.stormed[port][prio]:
                ps.pause(prio, now, now)  # stop honouring the pause
                if self._watchdog_drops:
                    self._flush(port, prio, now, "pfc_watchdog")

    def _flush(self, port: int, prio: int, now: float, reason: str) -> None:
        ps = self.ports[port]
        for e in ps.queues[prio].drain():
            ps.queue_bytes[prio] -= e.size
            ps.drops[reason] += 1
            self._release(e, prio, now)
        ps.queued &= ~(1 << prio)

    def set_routes(self, routes: dict[int, tuple[int, ...]]) -> None:
        """New routes (after links failed or came back elsewhere in the fabric)."""
        self.config.routes = routes
        self.forwarding.forget(routes=True)

    def set_link(self, port: int, up: bool, now: float) -> None:
        """Take a port's link down (its queues are lost, counted) or bring it back up."""
        ps = self.ports[port]
        ps.up = up
        if not up:
            for prio in range(PRIORITIES):
                self._flush(port, prio, now, "link_down")
            ps.control.clear()
        self.forwarding.forget(routes=False)
