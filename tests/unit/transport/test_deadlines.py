"""The NIC's deadline heap (rocev2_emu.nic.deadlines): (time, QPN) order, stale entries
skipped, one handling per live deadline."""

from __future__ import annotations

from rocev2_emu.nic.config import NicConfig
from rocev2_emu.nic.core import NicCore
from rocev2_emu.nic.deadlines import Deadlines
from rocev2_emu.transport.qp import NO_DEADLINE, QueuePair
from rocev2_emu.transport.qp_state import QPState


def _qps(n: int) -> list[QueuePair]:
    nic = NicCore(NicConfig(ip="10.0.0.1"))
    pd, cq = nic.alloc_pd(), nic.create_cq(16)
    qps = [nic.create_qp(pd, cq, cq) for _ in range(n)]
    for qp in qps:
        qp.state = QPState.RTS  # a QP has deadlines only when it may send
    return qps


def _at(qp: QueuePair, t: float | None) -> None:
    qp.requester.ack_deadline = t


def test_due_hands_out_qps_by_time_then_qpn_and_each_live_deadline_once() -> None:
    qps = _qps(4)
    d = Deadlines()
    for qp, t in zip(qps, (3e-6, 1e-6, 3e-6, 2e-6), strict=True):
        _at(qp, t)
        d.refresh(qp)
    assert d.first() == 1e-6
    assert d.due(0.5e-6) is None
    order = []
    while (due := d.due(5e-6)) is not None:
        order.append(due)
        assert due.deadline == NO_DEADLINE
    assert order == [qps[1], qps[3], *sorted((qps[0], qps[2]), key=lambda q: q.qpn)]
    assert d.first() == NO_DEADLINE


def test_a_moved_or_cleared_deadline_leaves_its_old_entry_stale() -> None:
    a, b = _qps(2)
    d = Deadlines()
    _at(a, 1e-6)
    d.refresh(a)
    _at(a, 4e-6)  # moved later: the entry at 1 us is stale
    d.refresh(a)
    _at(b, 2e-6)
    d.refresh(b)
    assert d.first() == 2e-6
    assert d.due(3e-6) is b
    assert d.due(3e-6) is None
    _at(a, None)  # cleared: nothing of it is due
    d.refresh(a)
    assert d.due(10e-6) is None and d.first() == NO_DEADLINE
    d.refresh(a)  # unchanged: no new entry
    assert d.heap == []
