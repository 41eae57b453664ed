"""The wall-clock pump's sends: what a link's delay released together leaves in batched calls,
one run per link in the order it was due, and what a blocked socket would not take waits, in
order, for the next round."""

from __future__ import annotations

from collections.abc import Sequence

from rocev2_emu.runtime.clock import DilatedClock
from rocev2_emu.runtime.link import FaultyLink, LinkFaults
from rocev2_emu.runtime.pump import TX_BATCH, Pump

PEERS = [("127.0.0.1", 4789), ("127.0.0.2", 4789)]


class RecordingPort:
    """Takes up to ``budget`` datagrams (then "would block") and records each call."""

    tx_errors = 0
    peer = None
    address = ("127.0.0.9", 4789)

    def __init__(self) -> None:
        self.budget = 1 << 30
        self.calls: list[tuple[str, tuple[str, int] | None, list[bytes]]] = []

    def _take(self, kind: str, peer: tuple[str, int] | None, datagrams: list[bytes]) -> int:
        taken = datagrams[: self.budget]
        self.budget -= len(taken)
        if taken:
            self.calls.append((kind, peer, taken))
        return len(taken)

    def recv(self) -> None:
        return None

    def send(self, data: bytes) -> bool:
        return self._take("send", None, [data]) == 1

    def send_to(self, data: bytes, peer: tuple[str, int]) -> bool:
        return self._take("send_to", peer, [data]) == 1

    def send_batch(self, datagrams: Sequence[bytes], peer: tuple[str, int] | None = None) -> int:
        return self._take("batch", peer, list(datagrams))


class QueuedCore:
    """A core whose frames are already due: (link index, datagram) in order."""

    def __init__(self, frames: list[tuple[int, bytes]]) -> None:
        self.frames = frames

    def next_out(self, now: float) -> tuple[int, bytes] | None:
        return self.frames.pop(0) if self.frames else None

    def get_timer(self) -> float | None:
        return None


def pump(frames: list[tuple[int, bytes]]) -> tuple[Pump, RecordingPort]:
    port = RecordingPort()
    delay = [LinkFaults(delay=1e-6), LinkFaults(delay=1e-6)]
    clock = DilatedClock.__new__(DilatedClock)  # never read: the test hands the pump its now
    clock.tdf = 1.0
    p = Pump(port, clock, QueuedCore(frames), name="test", faults=list(delay), peers=PEERS)  # type: ignore[arg-type]
    return p, port


def test_what_a_delay_releases_together_leaves_in_one_batched_call_per_link() -> None:
    a, b, c, d = b"a" * 60, b"b" * 60, b"c" * 60, b"d" * 60
    p, port = pump([(0, a), (1, c), (0, b), (0, d)])
    assert p._transmit(0.0)  # every frame still on its link's delay
    assert port.calls == []
    assert p._transmit(2e-6)
    assert port.calls == [("batch", PEERS[0], [a, b, d]), ("batch", PEERS[1], [c])]


def test_a_blocked_socket_keeps_the_rest_in_order_for_the_next_round() -> None:
    frames = [(0, bytes([i]) * 60) for i in range(TX_BATCH + 6)] + [(1, b"z" * 60)]
    p, port = pump(list(frames))
    p._transmit(0.0)
    port.budget = 10
    assert not p._transmit(2e-6)  # would block after ten datagrams
    port.budget = 1 << 30
    assert p._transmit(3e-6)
    sent = [(peer, d) for _, peer, run in port.calls for d in run]
    assert sent == [(PEERS[i], d) for i, d in frames]
    runs = [(peer, len(run)) for _, peer, run in port.calls]
    assert runs == [(PEERS[0], 10), (PEERS[0], TX_BATCH + 6 - 10), (PEERS[1], 1)]


def test_a_delay_only_link_holds_each_frame_its_delay_until_its_faults_change() -> None:
    link = FaultyLink(LinkFaults(delay=2e-6))
    assert link.submit(b"a", 0.0) == [] and link.submit(b"b", 1e-6) == []
    assert link.due(2.5e-6) == [b"a"] and link.get_timer() == 3e-6
    link.update(LinkFaults(delay=2e-6, loss=1.0))
    assert link.submit(b"c", 3e-6) == [] and link.lost == 1
    assert link.due(10e-6) == [b"b"] and link.get_timer() is None
