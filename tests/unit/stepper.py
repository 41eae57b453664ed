"""Hand-stepped two-NIC harness for the sans-IO core: a direct link with a fixed delay, on the
product's event engine (:mod:`rocev2_emu.runtime.engine`) stepped by hand, without trio.

Time is advanced explicitly to the next event (a frame's arrival or a NIC timer), so every test
is exact and independent of the machine.  ``tamper`` sees each datagram in flight and returns
the datagrams to deliver instead (drop: ``[]``, duplicate: ``[d, d]``, corrupt: ``[d']``).
Tests call the NIC cores directly, so every step first services both NICs
(:mod:`tests.unit.hand_stepped`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from rocev2_emu.nic.config import NicConfig
from rocev2_emu.nic.core import NicCore
from rocev2_emu.nic.driver import nic_node
from rocev2_emu.transport.memory import Access, MemoryRegion
from rocev2_emu.transport.qp import QueuePair
from rocev2_emu.transport.qp_state import QPAttr, QPState
from rocev2_emu.transport.work import CompletionQueue, WorkCompletion
from rocev2_emu.wire.decode import decode_datagram_untrusted
from rocev2_emu.wire.roce import FrameTemplate, RoceFrame
from tests.unit.hand_stepped import HandStepped

Tamper = Callable[[int, bytes, float], list[bytes]]


def gather(into: list[WorkCompletion], new: Iterable[WorkCompletion]) -> int:
    """Add ``new`` completions to ``into``; how many there are now (for ``run``'s predicates)."""
    into.extend(new)
    return len(into)


def decode(datagram: bytes | bytearray) -> RoceFrame:
    frame = decode_datagram_untrusted(datagram)[1]
    assert isinstance(frame, RoceFrame)
    return frame


@dataclass
class Endpoint:
    nic: NicCore
    cq: CompletionQueue
    qp: QueuePair
    pd: object = None
    mrs: list[MemoryRegion] = field(default_factory=list)

    def completions(self) -> list[WorkCompletion]:
        return self.cq.poll(1 << 20)


class _TamperedLink:
    """The link out of NIC ``index``: records what it sent, then ``tamper`` decides."""

    def __init__(self, stepper: Stepper, index: int) -> None:
        self.stepper = stepper
        self.index = index

    def fates(self, datagram: bytes, now: float) -> list[tuple[float, bytes]]:
        st = self.stepper
        st.sent[self.index].append(datagram)
        out = st.tamper(self.index, datagram, now) if st.tamper else [datagram]
        return [(now + st.delay, x) for x in out]


class Stepper(HandStepped):
    def __init__(
        self,
        *,
        delay: float = 1e-6,
        link_bps: float = 100e9,
        mtu: int = 1024,
        timeout: int = 14,
        retry_cnt: int = 7,
        rnr_retry: int = 7,
        min_rnr_timer: int = 1,
        max_rd_atomic: int = 4,
        tamper: Tamper | None = None,
        psn: tuple[int, int] | None = None,
    ) -> None:
        super().__init__()
        self.delay = delay
        self.tamper = tamper
        self.sent: list[list[bytes]] = [[], []]
        self.eps: list[Endpoint] = []
        for i in range(2):
            nic = NicCore(NicConfig(ip=f"10.0.0.{i + 1}", link_bps=link_bps))
            pd = nic.alloc_pd()
            cq = nic.create_cq(1 << 16)
            qp = nic.create_qp(pd, cq, cq)
            self.eps.append(Endpoint(nic, cq, qp, pd))
            self.nodes.append(self.engine.add(nic_node(nic)))
        self.engine.connect(self.nodes[0], 0, self.nodes[1], 0, (None, None))
        for i, node in enumerate(self.nodes):
            wire = node.wires[0]
            assert wire is not None
            wire.faulty = _TamperedLink(self, i)
        psns = psn or (self.eps[0].nic.random_psn(), self.eps[1].nic.random_psn())
        for i, ep in enumerate(self.eps):
            peer = self.eps[1 - i]
            ep.nic.modify_qp(
                ep.qp,
                QPAttr(
                    qp_state=QPState.INIT,
                    port_num=1,
                    qp_access_flags=Access.LOCAL_WRITE
                    | Access.REMOTE_WRITE
                    | Access.REMOTE_READ
                    | Access.REMOTE_ATOMIC,
                ),
            )
            ep.nic.modify_qp(
                ep.qp,
                QPAttr(
                    qp_state=QPState.RTR,
                    path_mtu=mtu,
                    dest_qp_num=peer.qp.qpn,
                    rq_psn=psns[1 - i],
                    max_dest_rd_atomic=max_rd_atomic,
                    min_rnr_timer=min_rnr_timer,
                    ah_attr=f"10.0.0.{2 - i}",
                ),
            )
            ep.nic.modify_qp(
                ep.qp,
                QPAttr(
                    qp_state=QPState.RTS,
                    sq_psn=psns[i],
                    timeout=timeout,
                    retry_cnt=retry_cnt,
                    rnr_retry=rnr_retry,
                    max_rd_atomic=max_rd_atomic,
                ),
            )

    @property
    def a(self) -> Endpoint:
        return self.eps[0]

    @property
    def b(self) -> Endpoint:
        return self.eps[1]

    def template(
        self, dst: Endpoint, src: Endpoint | None = None, *, src_ip: int | None = None
    ) -> FrameTemplate:
        """Headers of frames to ``dst`` as ``src``'s NIC would write them (UDP source port
        0xC000), or from ``src_ip`` with no MAC: for tests that forge a frame."""
        return FrameTemplate(
            vni=1,
            src_mac=src.nic.mac if src is not None else bytes(6),
            dst_mac=dst.nic.mac,
            src_ip=src_ip if src_ip is not None else src.nic.ip if src is not None else 0,
            dst_ip=dst.nic.ip,
            sport=0xC000,
        )

    def reg(
        self,
        ep: Endpoint,
        buf: object,
        access: Access = Access.LOCAL_WRITE
        | Access.REMOTE_WRITE
        | Access.REMOTE_READ
        | Access.REMOTE_ATOMIC,
    ) -> MemoryRegion:
        assert isinstance(ep.pd, object)
        mr = ep.nic.reg_mr(ep.pd, buf, access)  # type: ignore[arg-type]
        ep.mrs.append(mr)
        return mr

    def run(
        self,
        until: Callable[[], bool] | None = None,
        max_time: float = 10.0,
        max_steps: int = 2_000_000,
    ) -> None:
        for _ in range(max_steps):
            if until is not None and until():
                return
            if not self.step() or self.now > max_time:
                if until is not None and not until():
                    raise AssertionError(f"condition not met by t={self.now:.6f}s")
                return
        raise AssertionError("too many steps")
