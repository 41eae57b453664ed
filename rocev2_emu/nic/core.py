"""The software NIC core (sans-IO): resources, frame dispatch, timers.

Owns the NIC's protection domains, memory regions, completion queues and queue pairs; decodes
every received VXLAN datagram (malformed frames, bad ICRC, bad IPv4 checksum, frames for
unknown or wrong-state QPs are counted by reason and dropped); sends CNPs for CE-marked
packets (DCQCN's notification point) and PFC from a slow host's receive buffer; and hands
transmission to its PFC-aware, paced egress (:mod:`rocev2_emu.nic.egress`).

Time is emulated seconds, passed in as ``now``; a driver maps it to the wall clock (TDF).
"""

from __future__ import annotations

import random
from typing import Any, Final

from rocev2_emu.nic.config import NicConfig
from rocev2_emu.nic.deadlines import Deadlines
from rocev2_emu.nic.egress import Egress
from rocev2_emu.nic.ingress import IngressQueue
from rocev2_emu.runtime.events import Core
from rocev2_emu.transport.counters import NicCounters
from rocev2_emu.transport.errors import LocalVerbsError
from rocev2_emu.transport.memory import Access, MemoryRegion, MemoryTable, ProtectionDomain
from rocev2_emu.transport.qp import NO_DEADLINE, QueuePair
from rocev2_emu.transport.qp_state import QPAttr, QPState
from rocev2_emu.transport.work import CompletionQueue, RecvWR, SendWR
from rocev2_emu.wire.bth import CNP_PAD_LEN, Opcode
from rocev2_emu.wire.decode import decode_frame_at
from rocev2_emu.wire.errors import MalformedFrame
from rocev2_emu.wire.ethernet import (
    ECN_CE,
    ECN_ECT0,
    VXLAN_FLAG_I,
    VXLAN_LEN,
    encode_vxlan,
    ip_to_int,
    mac_for_ip,
    wire_len,
)
from rocev2_emu.wire.linerate import NOMINAL_BPS
from rocev2_emu.wire.pfc import PfcFrame, encode_pfc
from rocev2_emu.wire.qos import PRIORITIES, priority_of

CNP_PAD: Final = bytes(CNP_PAD_LEN)
_CNP: Final = 0x81  # Opcode.CNP as a literal: the compiled core compares C ints, no enum look-up
assert int(Opcode.CNP) == _CNP


class NicCore(Core):
    """A RoCEv2 NIC with one Ethernet port (port 0), driven through the four methods of
    :class:`~rocev2_emu.runtime.events.Core`."""

    def __init__(self, config: NicConfig, rng: random.Random | None = None) -> None:
        """``rng`` draws QPNs, PSNs and keys: a CSPRNG unless a test injects a seeded one."""
        self.config = config
        self.rng = rng or random.SystemRandom()
        self.ip = ip_to_int(config.ip)
        self.mac = config.mac or mac_for_ip(self.ip)
        self.counters = NicCounters()
        self.elide = config.timing_only  # (read per frame: an attribute, not the config's)
        self.mrs = MemoryTable(self.rng)
        self.qps: dict[int, QueuePair] = {}
        self.cqs: list[CompletionQueue] = []
        self.grown_cqs: dict[int, CompletionQueue] = {}  # queues pushed since a driver looked
        self.receive_waiters = 0  # tasks a driver wakes on every datagram received (perftest)
        self.pause_frames_sent = [0] * PRIORITIES  # mlx5 tx_prioN_pause (a slow receiver's)
        self.ingress = (
            IngressQueue(config.ingress, config.link_bps or NOMINAL_BPS)
            if config.ingress is not None and config.ingress.rx_bps
            else None
        )
        # QP deadlines (requester ACK/RNR timers, rate control) cost O(log n), not a scan of
        # every QP: a heap with stale entries skipped, refreshed for the QPs an operation touched
        self._deadlines = Deadlines()
        self.egress = Egress(config, self.ip, self.mac, self.counters, self._deadlines)
        self.pacer = self.egress.pacer  # (the egress's own, for drivers and metrics)
        self.paused_until = self.egress.paused_until
        self.pause_frames_received = self.egress.pause_frames_received
        self._active = self.egress.active  # (the egress's: a QP joins its priority's turn)

    # -- resources (called by the verbs layer) ---------------------------------------------
    def alloc_pd(self) -> ProtectionDomain:
        return self.mrs.alloc_pd()

    def reg_mr(self, pd: ProtectionDomain, buffer: Any, access: Access) -> MemoryRegion:
        return self.mrs.register(pd, buffer, Access(access))

    def dereg_mr(self, mr: MemoryRegion) -> None:
        self.mrs.deregister(mr)

    def _cq_grew(self, cq: CompletionQueue) -> None:
        self.grown_cqs[cq.handle] = cq

    def create_cq(self, depth: int = 4096) -> CompletionQueue:
        cq = CompletionQueue(len(self.cqs) + 1, depth, self._cq_grew)
        self.cqs.append(cq)
        return cq

    def create_qp(
        self,
        pd: ProtectionDomain,
        send_cq: CompletionQueue,
        recv_cq: CompletionQueue,
        *,
        max_send_wr: int = 1024,
        max_recv_wr: int = 1024,
        sq_sig_all: bool = False,
    ) -> QueuePair:
        while True:
            qpn = self.rng.getrandbits(24)
            if qpn > 1 and qpn not in self.qps:  # QP0 and QP1 are reserved (SMI, GSI)
                break
        qp = QueuePair(
            qpn=qpn,
            pd=pd,
            send_cq=send_cq,
            recv_cq=recv_cq,
            mrs=self.mrs,
            counters=self.counters,
            max_send_wr=max_send_wr,
            max_recv_wr=max_recv_wr,
            sq_sig_all=sq_sig_all,
        )
        qp.max_inflight = self.config.max_inflight
        qp.timing_only = self.elide
        self.qps[qpn] = qp
        return qp

    def destroy_qp(self, qp: QueuePair) -> None:
        if self.qps.get(qp.qpn) is not qp:
            raise LocalVerbsError(f"{qp!r} does not belong to this NIC")
        del self.qps[qp.qpn]
        qp.alive = False  # a post to it after this touches it, and leaves its deadline alone
        qp.deadline = NO_DEADLINE  # its entries on the heap are stale
        self._active[qp.priority].pop(qp, None)  # (if touched, the look skips it: not alive)

    def modify_qp(self, qp: QueuePair, attr: QPAttr) -> None:
        self._active[qp.priority].pop(qp, None)
        qp.modify(attr)
        qp.template = qp.cnp_template = None
        if qp.dest_ip is not None:
            qp.peer_ip = ip_to_int(qp.dest_ip)  # (the path's source IP of what it receives)
        qp.priority = self.priority_of(self.dscp_of(qp))
        self.egress.use_priority(qp.priority)
        if qp.state is QPState.RTS and qp.rc is None:
            qp.rc = self.config.rate_control.create(self.config.link_bps or NOMINAL_BPS, 0.0)
            qp.rc.catchup = self.config.catchup
        if qp.state in (QPState.RTS, QPState.ERR):
            self._active[qp.priority][qp] = None
        self._deadlines.touch(qp)

    def dscp_of(self, qp: QueuePair) -> int:
        return self.egress.dscp_of(qp)

    def priority_of(self, dscp: int) -> int:
        """The 802.1p priority of a DSCP: the configured map, else its class selector."""
        return priority_of(self.config.dscp_map, dscp)

    def post_send(self, qp: QueuePair, wr: SendWR) -> None:
        qp.post_send(wr)
        self._active[qp.priority][qp] = None
        self._deadlines.touch(qp)

    def post_recv(self, qp: QueuePair, wr: RecvWR) -> None:
        qp.post_recv(wr)

    def random_psn(self) -> int:
        return self.rng.getrandbits(24)

    # -- the core interface ----------------------------------------------------------------
    def receive(self, port: int, data: bytes, now: float) -> None:
        self.receive_datagram(data, now)

    def has_news(self, received: int) -> bool:
        """A queue grew, or datagrams arrived while a task waits for them."""
        return bool(self.grown_cqs) or (received > 0 and self.receive_waiters > 0)

    def next_out(self, now: float) -> tuple[int, bytes] | None:
        datagram = self.egress.next_datagram(now)
        return None if datagram is None else (0, datagram)

    # -- receive ---------------------------------------------------------------------------
    def receive_datagram(self, data: bytes | bytearray | memoryview, now: float) -> None:
        """Handle one VXLAN datagram from the link.  Never raises for bad input: counts it."""
        if self.ingress is not None:  # a slow host: the frame waits in the receive buffer
            datagram = bytes(data)
            size = wire_len(datagram) + VXLAN_LEN if self.elide else len(datagram)
            if not self.ingress.arrive(datagram, now, size):
                self.counters.rx_drops["rx_buffer_full"] += 1
            self._edge_pfc(now)
            return
        self._receive(data, now)

    def _edge_pfc(self, now: float) -> None:
        assert self.ingress is not None
        quanta = self.ingress.pfc_decision(now)
        if quanta is not None:
            priorities = self.ingress.config.priorities
            for prio in priorities:
                self.pause_frames_sent[prio] += 1
            pause = encode_pfc(self.mac, dict.fromkeys(priorities, quanta))
            self.queue_control(encode_vxlan(self.config.vni, pause))

    def _receive(self, data: bytes | bytearray | memoryview, now: float) -> None:
        c = self.counters
        c.rx_packets += 1
        datagram = data if isinstance(data, bytes) else bytes(data)
        elide = self.elide
        # (a runt counts as a packet, not as bytes; an elided frame as its whole length)
        c.rx_bytes += wire_len(datagram) if elide else max(0, len(datagram) - VXLAN_LEN)
        try:
            if len(datagram) < VXLAN_LEN or not datagram[0] & VXLAN_FLAG_I:
                raise MalformedFrame("vxlan", "not a VXLAN datagram (short, or no I flag)")
            frame = decode_frame_at(datagram, VXLAN_LEN, not elide, elide)
        except MalformedFrame as exc:
            c.rx_drops[exc.reason] += 1
            return
        if isinstance(frame, PfcFrame):
            self.egress.on_pfc(frame, now)
            return
        if frame.dst_ip != self.ip:
            c.rx_drops["wrong_dst_ip"] += 1
            return
        if frame.opcode == _CNP:
            c.cnp_received += 1
            target = self.qps.get(frame.dqpn)
            if target is not None and not target.from_peer(frame.src_ip):
                c.rx_drops["wrong_src_ip"] += 1  # a CNP not from the QP's peer
                return
            if target is not None and target.rc is not None:
                c.rp_cnp_handled += 1
                target.rc.on_cnp(now=now)
                self._deadlines.touch(target)
            else:
                c.rp_cnp_ignored += 1
            return
        if frame.ecn == ECN_CE:
            c.np_ecn_marked_roce_packets += 1
            if self.config.send_cnps:
                self._notify(frame.dqpn, frame.src_ip, now)
        if frame.opcode >= 0x20:
            c.rx_drops["unsupported_transport"] += 1
            return
        qp = self.qps.get(frame.dqpn)
        if qp is None:
            c.rx_drops["unknown_qp"] += 1
            return
        # what rxe checks of an RC packet (rxe_recv.c, check_addr and check_keys): it comes
        # from the QP's peer, and its P_Key matches the default partition's (0x7FFF, either
        # membership); for requests and responses alike, so no host can write into, or
        # acknowledge for, another host's connection
        if not qp.from_peer(frame.src_ip):  # (any before RTR: the state check refuses it)
            c.rx_drops["wrong_src_ip"] += 1
            return
        if frame.pkey & 0x7FFF != 0x7FFF:
            c.rx_drops["bad_pkey"] += 1
            return
        accepted = qp.receive(frame, now)
        self._deadlines.touch(qp)
        if not accepted:
            c.rx_drops["qp_state"] += 1
            return
        self._active[qp.priority][qp] = None

    def _notify(self, qpn: int, src_ip: int, now: float) -> None:
        """DCQCN notification point: a CNP to the sender of a CE-marked packet, at most one
        per QP per ``cnp_interval`` (sent on the CNP priority, ahead of data)."""
        qp = self.qps.get(qpn)
        if qp is None or qp.dest_ip is None or now - qp.last_cnp < self.config.cnp_interval:
            return
        if not qp.from_peer(src_ip):
            return  # marked, but not by the QP's peer's packet: no CNP on its behalf
        qp.last_cnp = now
        tpl = qp.cnp_template
        if tpl is None:  # ECT(0) on the CNP DSCP, as the ConnectX-4 Lx capture in our tests
            tpl = qp.cnp_template = self.egress.new_template(qp, self.config.cnp_dscp, ECN_ECT0)
        self.queue_control(
            tpl.build(Opcode.CNP, qp.dest_qpn, 0, ext=CNP_PAD, becn=True, elide=self.elide)
        )
        self.counters.np_cnp_sent += 1

    # -- transmit --------------------------------------------------------------------------
    def queue_control(self, datagram: bytes | bytearray) -> None:
        """Queue a control frame (PFC, CNP) that is not subject to PFC pause or QP order."""
        self.egress.queue_control(datagram)

    def next_datagram(self, now: float) -> bytes | None:
        """The next VXLAN datagram to put on the link at ``now``, or None (see get_timer)."""
        return self.egress.next_datagram(now)

    # -- timers ----------------------------------------------------------------------------
    @property
    def tx_behind_schedule(self) -> int:
        """Frames that left later than their line-rate slot and the catch-up allowance."""
        return self.pacer.behind_schedule

    def get_timer(self) -> float | None:
        """Emulated time at which handle_timer / next_datagram next have work, or None.
        (Times are native floats with a flag for "none yet" until the answer: a ``float |
        None`` is a boxed float at every assignment in compiled code.)"""
        deadlines = self._deadlines
        deadlines.refresh_touched()
        t = deadlines.first()
        has_t = t != NO_DEADLINE
        if self.ingress is not None:
            i = self.ingress.get_timer()
            if i is not None and (not has_t or i < t):
                t = i
                has_t = True
        send = self.egress.next_time()
        if send != NO_DEADLINE and (not has_t or send < t):
            return send
        return t if has_t else None

    def handle_timer(self, now: float) -> None:
        if self.ingress is not None:
            for datagram in self.ingress.due(now):
                self._receive(datagram, now)
            self._edge_pfc(now)
        deadlines = self._deadlines
        deadlines.refresh_touched()
        while (qp := deadlines.due(now)) is not None:
            qp.handle_timer(now)
            self._deadlines.touch(qp)
            self._active[qp.priority][qp] = None
