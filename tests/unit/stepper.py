"""Hand-stepped two-NIC harness for the sans-IO core: a direct link with a fixed delay.

Time is advanced explicitly to the next event (a frame's arrival or a NIC timer), so every test
is exact and independent of the machine.  ``tamper`` sees each datagram in flight and returns
the datagrams to deliver instead (drop: ``[]``, duplicate: ``[d, d]``, corrupt: ``[d']``).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from rocev2_emu.nic.core import NicConfig, NicCore
from rocev2_emu.transport.memory import Access, MemoryRegion
from rocev2_emu.transport.qp import QueuePair
from rocev2_emu.transport.qp_state import QPAttr, QPState
from rocev2_emu.transport.work import CompletionQueue, WorkCompletion
from rocev2_emu.wire.roce import RoceFrame, decode_datagram_untrusted

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


class Stepper:
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
        self.now = 0.0
        self.delay = delay
        self.tamper = tamper
        self.in_flight: list[tuple[float, int, int, bytes]] = []
        self._seq = 0
        self.sent: list[list[bytes]] = [[], []]
        self.eps: list[Endpoint] = []
        for i in range(2):
            nic = NicCore(NicConfig(ip=f"10.0.0.{i + 1}", link_bps=link_bps))
            pd = nic.alloc_pd()
            cq = nic.create_cq(1 << 16)
            qp = nic.create_qp(pd, cq, cq)
            self.eps.append(Endpoint(nic, cq, qp, pd))
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

    def _pump(self) -> None:
        for i, ep in enumerate(self.eps):
            ep.nic.handle_timer(self.now)
            while (d := ep.nic.next_datagram(self.now)) is not None:
                data = bytes(d)
                self.sent[i].append(data)
                out = self.tamper(i, data, self.now) if self.tamper else [data]
                for x in out:
                    self._seq += 1
                    heapq.heappush(self.in_flight, (self.now + self.delay, self._seq, 1 - i, x))

    def step(self) -> bool:
        """Advance to the next event; False when nothing is left to happen."""
        self._pump()
        times = [t for ep in self.eps if (t := ep.nic.get_timer()) is not None]
        if self.in_flight:
            times.append(self.in_flight[0][0])
        if not times:
            return False
        self.now = max(self.now, min(times))
        while self.in_flight and self.in_flight[0][0] <= self.now:
            _, _, dst, data = heapq.heappop(self.in_flight)
            self.eps[dst].nic.receive_datagram(data, self.now)
        return True

    def advance_to(self, t: float) -> None:
        """Process every event up to emulated time ``t``, then set the clock to ``t``."""
        while True:
            self._pump()
            times = [x for ep in self.eps if (x := ep.nic.get_timer()) is not None]
            if self.in_flight:
                times.append(self.in_flight[0][0])
            if not times or min(times) > t:
                self.now = max(self.now, t)
                return
            self.step()

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
