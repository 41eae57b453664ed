"""A NIC's transmitter (sans-IO, compiled with mypyc): a PFC-aware, paced egress.

Control frames (PFC, CNPs) leave first; then QPs' packets - priorities highest first, a
priority stopped while an 802.1Qbb pause for it is in force, the QPs of a priority taking
turns (round-robin) - each frame leaving at the link's line rate: its departure time is
computed (frame + preamble, SFD, FCS and inter-frame gap), never slept for.  Frames are built
from each QP's header template (its peer, through the link's next hop).
"""

from __future__ import annotations

from rocev2_emu.nic.config import NicConfig
from rocev2_emu.nic.deadlines import Deadlines
from rocev2_emu.transport.counters import NicCounters
from rocev2_emu.transport.errors import LocalVerbsError
from rocev2_emu.transport.qp import NO_DEADLINE, QueuePair
from rocev2_emu.wire.ethernet import VXLAN_LEN, ip_to_int, mac_for_ip, wire_len
from rocev2_emu.wire.linerate import NOMINAL_BPS, LinePacer
from rocev2_emu.wire.pfc import PfcFrame
from rocev2_emu.wire.qos import PRIORITIES
from rocev2_emu.wire.roce import FrameTemplate, rxe_udp_sport


class Egress:
    """The transmitter of a NIC with address ``ip`` and ``mac``.  Holds, per priority, the QPs
    with something to send in their turn order (a dict as an ordered set: QPs hash by identity,
    so no QPN is boxed a look-up), the priorities QPs have used, and the few control frames
    waiting.  A QP it sends from is touched on ``deadlines`` (its deadline may have moved)."""

    def __init__(
        self, config: NicConfig, ip: int, mac: bytes, counters: NicCounters, deadlines: Deadlines
    ) -> None:
        self.config = config
        self.ip = ip
        self.mac = mac
        self.counters = counters
        self.deadlines = deadlines
        self.elide = config.timing_only  # (read per frame: an attribute, not the config's)
        self.pacer = LinePacer(config.link_bps, config.catchup)  # the link's transmitter
        self.paused_until = [0.0] * PRIORITIES
        self.pause_frames_received = [0] * PRIORITIES  # mlx5 rx_prioN_pause
        self.active: list[dict[QueuePair, None]] = [{} for _ in range(PRIORITIES)]
        self.prio_order: list[int] = []  # the priorities QPs have used, highest first
        self.control: list[bytes] = []  # PFC frames and CNPs, sent first (a few: a list)

    def use_priority(self, prio: int) -> None:
        """A QP sends on ``prio`` (one no QP uses any more stays, its queue empty)."""
        if prio not in self.prio_order:
            self.prio_order = sorted([*self.prio_order, prio], reverse=True)

    def queue_control(self, datagram: bytes | bytearray) -> None:
        """Queue a control frame (PFC, CNP) that is not subject to PFC pause or QP order."""
        self.control.append(bytes(datagram))

    def on_pfc(self, frame: PfcFrame, now: float) -> None:
        """An 802.1Qbb frame from the link: pause (or resume) the priorities it names."""
        rate = self.config.link_bps or NOMINAL_BPS
        if not frame.class_enable & 0xFF:  # pauses nothing: counted, not ignored silently
            self.counters.rx_drops["pfc_no_class_enabled"] += 1
            return
        for prio in range(PRIORITIES):
            if frame.class_enable >> prio & 1:
                self.pause_frames_received[prio] += 1
                self.paused_until[prio] = now + frame.pause_seconds(prio, rate)

    def next_datagram(self, now: float) -> bytes | None:
        """The next VXLAN datagram to put on the link at ``now``, or None (:meth:`next_time`)."""
        pacer = self.pacer
        if not pacer.ready(now):
            return None
        datagram = self.control.pop(0) if self.control else self._next_qp_datagram(now)
        if datagram is None:
            pacer.idle = True  # the next frame starts a new busy period at its own time
            return None
        size = wire_len(datagram) if self.elide else len(datagram) - VXLAN_LEN
        c = self.counters
        c.tx_packets += 1
        c.tx_bytes += size
        pacer.depart(size, now)
        return datagram

    def _next_qp_datagram(self, now: float) -> bytes | None:
        """Highest priority first; within a priority, QPs take turns (round-robin)."""
        paused_until = self.paused_until
        for prio in self.prio_order:
            active = self.active[prio]
            if not active or paused_until[prio] > now:
                continue
            for _ in range(len(active)):
                for qp in active:  # noqa: B007 - the first in line (compiled: no iterator, no call)
                    break
                rc = qp.rc
                if rc is not None and rc.next_send_time > now and not qp.responder.out:
                    if len(active) > 1:  # paced by its rate: let the others go first
                        del active[qp]
                        active[qp] = None
                    continue
                pkt = qp.next_packet(now)
                self.deadlines.touch(qp)
                if pkt is None:
                    del active[qp]
                    continue
                if len(active) > 1:  # to the back of the line
                    del active[qp]
                    active[qp] = None
                tpl = qp.template or self._template_for(qp)
                datagram = tpl.build(
                    pkt.opcode,
                    qp.dest_qpn,
                    pkt.psn,
                    pkt.ackreq,
                    pkt.solicited,
                    pkt.ext,
                    pkt.payload,
                    elide=self.elide,
                )
                if rc is not None and rc.rate < rc.line_rate and pkt.payload:
                    size = wire_len(datagram) if self.elide else len(datagram) - VXLAN_LEN
                    rc.on_sent(size=size, now=now)  # below line rate
                return datagram
        return None

    def dscp_of(self, qp: QueuePair) -> int:
        return self.config.dscp if qp.traffic_class is None else qp.traffic_class

    def _template_for(self, qp: QueuePair) -> FrameTemplate:
        tpl = self.new_template(qp, self.dscp_of(qp), self.config.ecn)
        qp.template = tpl
        return tpl

    def new_template(self, qp: QueuePair, dscp: int, ecn: int) -> FrameTemplate:
        """Headers of frames from ``qp`` to its peer, through the link's next hop."""
        if qp.dest_ip is None:
            raise LocalVerbsError(f"{qp!r} has no destination address")
        dst = ip_to_int(qp.dest_ip)
        cfg = self.config
        return FrameTemplate(
            vni=cfg.vni,
            src_mac=self.mac,
            dst_mac=cfg.next_hop_mac or mac_for_ip(dst),
            src_ip=self.ip,
            dst_ip=dst,
            sport=rxe_udp_sport(qp.qpn),
            dscp=dscp,
            ecn=ecn,
        )

    def next_time(self) -> float:
        """When :meth:`next_datagram` may next have a frame, or NO_DEADLINE: the pacer's
        next slot, a QP's rate limit and its priority's pause."""
        send = 0.0
        if self.control:
            has_send = True
            if self.config.link_bps:
                send = self.pacer.free_at
        else:
            has_send = False
            for prio in self.prio_order:
                if self.active[prio]:
                    e = self._earliest(prio)
                    if not has_send or e < send:
                        send = e
                        has_send = True
            if has_send and self.config.link_bps:
                free = self.pacer.free_at
                if free > send:
                    send = free
        return send if has_send else NO_DEADLINE

    def _earliest(self, prio: int) -> float:
        """When the first QP of ``prio`` may send: its rate limit and the priority's pause."""
        first = 0.0
        for i, qp in enumerate(self.active[prio]):
            rc = qp.rc
            if rc is None:  # an unpaced QP may send at once
                first = 0.0
                break
            if i == 0 or rc.next_send_time < first:
                first = rc.next_send_time
        paused = self.paused_until[prio]
        return first if first > paused else paused
