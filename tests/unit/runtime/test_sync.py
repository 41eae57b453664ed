"""The exact mode's synchronisation (rocev2_emu/runtime/sync.py) and the checks an exact engine
makes of every frame from another process (rocev2_emu/runtime/exact.py)."""

from __future__ import annotations

import math
import socket

import pytest

from rocev2_emu.runtime.events import Core, Node
from rocev2_emu.runtime.exact import ExactEngine, RemoteLink
from rocev2_emu.runtime.ports import UdpPort
from rocev2_emu.runtime.sync import (
    TRAILER,
    Coordinator,
    Report,
    SyncError,
    next_window,
    split_trailer,
    with_trailer,
)


def test_the_trailer_carries_the_exact_arrival_time_and_sequence() -> None:
    at = 1e-3 + 3 * 0.1e-6  # not a round number in binary: it must come back bit for bit
    frame, got_at, seq = split_trailer(with_trailer(b"frame", at, 7))
    assert (frame, got_at, seq) == (b"frame", at, 7)
    with pytest.raises(ValueError, match="no room"):
        split_trailer(b"x" * TRAILER.size)
    with pytest.raises(ValueError, match="arrival time"):
        split_trailer(b"frame" + TRAILER.pack(math.nan, 1))


def _report(nxt: float, sent: dict[str, int], received: int, quiet: bool = False) -> Report:
    return Report(nxt, quiet, sent, received, 0)


def test_a_window_ends_one_lookahead_after_the_earliest_next_event() -> None:
    reports = {
        "a": _report(5e-6, {"b": 3}, 1),
        "b": _report(2e-6, {"a": 1, "c": 2}, 0),
        "c": _report(math.inf, {}, 0),
    }
    window = next_window(reports, 1e-6)
    assert window.until == pytest.approx(3e-6)
    assert window.expect == {"a": 1, "b": 3, "c": 2}  # what the others sent each
    assert not window.quiet


def test_the_fabric_is_quiet_only_when_every_frame_sent_was_received() -> None:
    sent = {"a": _report(math.inf, {"b": 2}, 0, True), "b": _report(math.inf, {}, 1, True)}
    assert not next_window(sent, 1e-6).quiet  # one frame to b is still in the socket
    sent["b"] = _report(math.inf, {}, 2, True)
    window = next_window(sent, 1e-6)
    assert window.quiet and window.until == math.inf


@pytest.mark.parametrize(
    ("msg", "match"),
    [
        ([1, 2], "must be a map"),
        ({"next": 1.0, "quiet": False, "sent": {}}, "missing or wrong"),
        ({"next": 1.0, "quiet": False, "sent": {}, "received": 0}, "missing or wrong"),
        ({"next": "soon", "quiet": False, "sent": {}, "received": 0, "window": 0}, "wrong"),
        ({"next": math.nan, "quiet": False, "sent": {}, "received": 0, "window": 0}, "NaN"),
    ],
)
def test_a_malformed_report_is_an_error_naming_what_is_wrong(msg: object, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        Report.from_wire(msg)


def test_no_lookahead_no_exact_run() -> None:
    with pytest.raises(ValueError, match="needs a delay > 0"):
        Coordinator(["a", "b"], 0.0, b"secret")


def _datagram(vni: int, seq: int, at: float = 1e-6) -> bytes:
    vxlan = bytes([0x08, 0, 0, 0, vni >> 16 & 0xFF, vni >> 8 & 0xFF, vni & 0xFF, 0])
    return with_trailer(vxlan + b"an ethernet frame", at, seq)


def _engine_with_a_link() -> tuple[ExactEngine, UdpPort, socket.socket, socket.socket]:
    udp = UdpPort(("127.0.0.1", 0), None, batch=False)
    peer = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    peer.bind(("127.0.0.1", 0))
    stranger = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    stranger.bind(("127.0.0.1", 0))
    engine = ExactEngine("n0", udp, chan=None)  # type: ignore[arg-type]  # no windows here
    node = engine.add(Node("n0", Core()))
    engine.link(RemoteLink(node, 0, 5, "n1", peer.getsockname(), None))
    return engine, udp, peer, stranger


def _pull_when_here(engine: ExactEngine, udp: UdpPort) -> None:
    udp.sock.setblocking(True)
    udp.sock.settimeout(10)
    data, sender = udp.sock.recvfrom(65536)  # wait for it (loopback), then hand it back
    udp.sock.setblocking(False)
    udp._split.append(memoryview(data))
    udp._split_from = sender
    engine._pull()


def test_frames_from_another_process_land_on_the_heap_in_order_and_a_gap_stops_the_run() -> None:
    engine, udp, peer, stranger = _engine_with_a_link()
    try:
        peer.sendto(_datagram(5, 1), udp.address)
        _pull_when_here(engine, udp)
        assert engine.received == 1 and engine.events.next_event_time() == 1e-6
        peer.sendto(_datagram(5, 3), udp.address)  # 2 never came
        with pytest.raises(SyncError, match=r"n0 port 0 <- n1 \(VNI 5\): frame 3 came when 2"):
            _pull_when_here(engine, udp)
    finally:
        udp.close()
        peer.close()
        stranger.close()


@pytest.mark.parametrize("case", ["stranger", "unknown vni", "short"])
def test_a_datagram_that_is_on_no_link_or_malformed_stops_the_run(case: str) -> None:
    engine, udp, peer, stranger = _engine_with_a_link()
    try:
        if case == "stranger":
            stranger.sendto(_datagram(5, 1), udp.address)
            match = "is on no link"
        elif case == "unknown vni":
            peer.sendto(_datagram(6, 1), udp.address)
            match = "VNI 6 is on no link"
        else:
            peer.sendto(_datagram(5, 1)[:12], udp.address)
            match = "no room for the sync trailer"
        with pytest.raises(SyncError, match=match):
            _pull_when_here(engine, udp)
    finally:
        udp.close()
        peer.close()
        stranger.close()
