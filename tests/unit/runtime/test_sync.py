"""The exact mode's synchronisation (rocev2_emu/runtime/sync.py, its messages and the
coordinator's decisions, stepped by hand) and the checks an exact engine makes of every frame
from another process (rocev2_emu/runtime/exact.py)."""

from __future__ import annotations

import math
import select
import socket
from functools import partial

import pytest
import trio
import trio.testing

from rocev2_emu.control.channel import ControlError
from rocev2_emu.runtime.coordinator import Coordinator
from rocev2_emu.runtime.events import Core, Node
from rocev2_emu.runtime.exact import ExactEngine
from rocev2_emu.runtime.exchange import RemoteLink
from rocev2_emu.runtime.ports import UdpPort
from rocev2_emu.runtime.rounds import STALL_SECONDS, Rounds, next_window
from rocev2_emu.runtime.sync import TRAILER, split_trailer, with_trailer
from rocev2_emu.runtime.sync_messages import (
    Grant,
    Hello,
    LinkChange,
    Report,
    RunOver,
    SyncError,
    change_faults,
    ended_normally,
    from_coordinator,
    process_label,
)
from tests.unit.runtime.outbox import Outbox


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
    assert {n: window.frames_due(n) for n in reports} == {"a": 1, "b": 3, "c": 2}
    # and by sender: a frame of the last window still on its way is waited for, whatever
    # another process's frame of the next one did meanwhile
    assert window.sources == {"a": {"b": 1}, "b": {"a": 3}, "c": {"b": 2}}
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
    readable, _, _ = select.select([udp.sock], [], [], 10)  # wait for it (loopback)
    assert readable, "the datagram did not arrive within 10 s"
    engine.exchange.pull()


def test_frames_from_another_process_land_on_the_heap_in_order_and_a_gap_stops_the_run() -> None:
    engine, udp, peer, stranger = _engine_with_a_link()
    try:
        peer.sendto(_datagram(5, 1), udp.address)
        _pull_when_here(engine, udp)
        assert engine.exchange.received == 1 and engine.events.next_event_time() == 1e-6
        peer.sendto(_datagram(5, 3), udp.address)  # 2 never came
        with pytest.raises(SyncError, match=r"n0 port 0 <- n1 \(VNI 5\): frame 3 came when 2"):
            _pull_when_here(engine, udp)
    finally:
        udp.close()
        peer.close()
        stranger.close()


async def test_a_window_waits_for_each_senders_frames_not_for_a_total() -> None:
    """n2's frame of the next window overtakes n1's of this one (a bridge, a busy kernel):
    the window starts only once n1's is in, as the grant's count from n1 says."""
    engine, udp, one, stranger = _engine_with_a_link()
    two = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    two.bind(("127.0.0.1", 0))
    node = engine.nodes[0]
    engine.link(RemoteLink(node, 1, 6, "n2", two.getsockname(), None))
    taken = trio.Event()

    async def take_in() -> None:
        await engine.exchange.take_in({"n1": 1})
        taken.set()

    try:
        with trio.fail_after(10):
            async with trio.open_nursery() as nursery:
                two.sendto(_datagram(6, 1, 3e-6), udp.address)  # the next window's, first
                await trio.lowlevel.wait_readable(udp.sock)
                nursery.start_soon(take_in)
                await trio.testing.wait_all_tasks_blocked()  # it took that one in, and waits
                assert engine.exchange.received == 1 and not taken.is_set()
                one.sendto(_datagram(5, 1), udp.address)
                await taken.wait()
        assert engine.exchange.received_from == {"n1": 1, "n2": 1}
    finally:
        for sock in (one, two, stranger):
            sock.close()
        udp.close()


def test_a_datagram_from_a_stranger_is_dropped_and_counted_and_the_run_goes_on() -> None:
    engine, udp, peer, stranger = _engine_with_a_link()
    try:
        stranger.sendto(_datagram(5, 1), udp.address)  # the link's VNI, the next sequence
        _pull_when_here(engine, udp)
        assert (engine.exchange.strays, engine.exchange.received) == (1, 0)
        peer.sendto(_datagram(5, 1), udp.address)  # the peer's own frame 1 is still due
        _pull_when_here(engine, udp)
        assert (engine.exchange.strays, engine.exchange.received) == (1, 1)
    finally:
        udp.close()
        peer.close()
        stranger.close()


@pytest.mark.parametrize("case", ["unknown vni", "short"])
def test_a_datagram_from_the_peer_that_is_on_no_link_or_malformed_stops_the_run(case: str) -> None:
    engine, udp, peer, stranger = _engine_with_a_link()
    try:
        if case == "unknown vni":
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


def test_a_link_change_crosses_the_wire_and_a_malformed_one_is_named() -> None:
    change = LinkChange(5e-6, (("spine0", "leaf0"), ("spine0", "leaf1")), False)
    assert LinkChange.from_wire(change.wire()) == change
    report = {"next": 1.0, "quiet": False, "sent": {}, "received": 0, "window": 0}
    assert Report.from_wire({**report, "changes": [change.wire()]}).changes == [change]
    lossy = LinkChange(None, (("h0", "sw0"),), True, change_faults({"loss": 0.01, "delay": 2e-6}))
    assert lossy.wire()[3] == {"delay": 2e-6, "loss": 0.01}  # only a faults change says them
    assert LinkChange.from_wire(lossy.wire()) == lossy and len(change.wire()) == 3
    assert lossy.at_instant(7e-6) == LinkChange(7e-6, lossy.pairs, True, lossy.faults)
    for bad, match in [
        ([5e-6, [["a", "b"]], True, {"loss": 1.5}], "not a probability"),
        ([5e-6, [["a", "b"]], True, {"jitter": True}], "not a boolean"),
        ([5e-6, [["a", "b"]]], "is \\[at"),
        ([-1.0, [["a", "b"]], False], "time"),
        ([5e-6, [["a", "b"]], "down"], "links or state"),
        ([5e-6, [], False], "node pairs"),
        ([5e-6, [["a", 3]], False], "node pairs"),
    ]:
        with pytest.raises(ValueError, match=match):
            LinkChange.from_wire(bad)


def _joined(names: list[str], lookahead: float = 1e-6) -> Rounds:
    """Decisions for ``names``, every one joined and the first poll granted (at 0)."""
    rounds = Rounds(names, lookahead)
    for name in names:
        assert rounds.join(name, ()) is None
    assert rounds.join(names[0], ()) is not None  # twice: refused
    rounds.release()
    for name in names:
        rounds.take(name, Report(0.0, False, {}, 0))
    plan = rounds.plan()
    assert plan is not None and plan.kind == "poll"
    assert [g.until for _, g in rounds.grants(plan)] == [0.0] * len(names)
    return rounds


def _window(rounds: Rounds, reports: dict[str, Report]) -> dict[str, Grant]:
    """Every process reports (as of the windows it was granted); the grants that follow."""
    done = False
    for name, report in reports.items():
        report.window = rounds.granted[name]
        done = rounds.take(name, report)
    assert done
    plan = rounds.plan()
    assert plan is not None
    return dict(rounds.grants(plan))


def test_a_link_change_goes_to_every_process_with_the_next_window_not_too_late() -> None:
    rounds = _joined(["h0", "sw0", "sw1"])
    change = LinkChange(5e-6, (("sw0", "sw1"),), False)
    asked = Report(1.0, False, {}, 0, changes=[change])
    # every process would be skipped (nothing before the window's end): the change wakes all,
    # and the window ends one lookahead after it
    grants = _window(
        rounds, {"h0": asked, **{n: Report(1.0, False, {}, 0) for n in ["sw0", "sw1"]}}
    )
    assert sorted(grants) == ["h0", "sw0", "sw1"]
    assert all(g.changes == [change] and g.until == 6e-6 for g in grants.values())
    assert all(from_coordinator(g.wire()) == g for g in grants.values())  # typed both ways
    grants = _window(rounds, {n: Report(1.0, False, {}, 0) for n in rounds.names})
    assert all(g.changes == [] for g in grants.values())  # handed out once
    with pytest.raises(SyncError, match=r"node h0: a link change at t=5\.000 us comes after"):
        rounds.ask("h0", [change])  # the run reached 1 s


async def test_an_engine_applies_a_change_when_its_clock_reaches_the_instant() -> None:
    udp = UdpPort(("127.0.0.1", 0), None, batch=False)
    try:
        _changes_at_their_instants(ExactEngine("sw0", udp, chan=None))  # type: ignore[arg-type]
    finally:
        udp.close()


def _changes_at_their_instants(engine: ExactEngine) -> None:
    seen: list[tuple[LinkChange, float]] = []
    engine.changes.on_change = lambda change, now: seen.append((change, now))
    late, early = LinkChange(9e-6, (("a", "b"),), True), LinkChange(4e-6, (("a", "b"),), False)
    for change in (late, early):
        engine.take_grant(Grant(1e-6, changes=[change]))
    assert engine.changes.next_time() == 4e-6 and engine.rounds == 2
    engine.changes.apply(3e-6)
    assert seen == []
    engine.changes.apply(5e-6)
    assert seen == [(early, 5e-6)] and engine.changes.next_time() == 9e-6
    engine.events.now = 1e-6
    engine.change_links(2e-6, [("a", "b")], up=False)
    assert engine.report().changes == [LinkChange(2e-6, (("a", "b"),), False)]
    assert engine.report().changes == []  # said once


async def test_a_paused_engine_reports_now_busy_and_never_quiet_until_it_resumes() -> None:
    """The torch backend pauses its engine while the script decides (wall time): the report
    holds the windows at now and says busy (a long pause is no stall); done once finished."""
    udp = UdpPort(("127.0.0.1", 0), None, batch=False)
    try:
        engine = ExactEngine("h0", udp, chan=None)  # type: ignore[arg-type]
        engine.origin = trio.current_time()
        engine.events.now = 3e-6
        idle = engine.report()
        assert idle.next_time == math.inf and idle.quiet and not idle.busy
        engine.pause()
        engine.pause()  # twice is once
        paused = engine.report()
        assert paused.next_time == 3e-6 and paused.held and paused.busy
        assert not paused.quiet and not paused.done
        assert Report.from_wire(paused.wire()) == paused
        engine.resume()
        assert engine.holds == 0 and engine.report().next_time == math.inf
        engine.pause()
        engine.finished()  # a finished application is not paused
        done = engine.report()
        assert done.done and not done.busy and engine.holds == 0
    finally:
        udp.close()


def test_a_process_with_work_before_the_end_of_its_window_gets_it_again() -> None:
    """A process woken while it waited for a window (its clock was paused or held) may report
    work before the end of the window it was granted, which no new window can move past: the
    coordinator grants it that window again, alone; a process still held is not woken."""
    rounds = _joined(["a", "b", "c"])
    _window(rounds, {n: Report(4e-6, False, {}, 0) for n in rounds.names})
    until = rounds.until
    assert until == pytest.approx(5e-6)
    for name, report in {
        "a": Report(3e-6, False, {}, 0),  # woken: work at 3 us, granted until 5 us
        "b": Report(3.5e-6, False, {}, 0, held=True),  # an out-of-band wait: it waits
        "c": Report(9e-6, False, {"a": 2}, 0),
    }.items():
        report.window = rounds.granted[name]
        rounds.take(name, report)
    plan = rounds.plan()
    assert plan is not None and plan.kind == "again" and plan.again == ["a"]
    assert rounds.grants(plan) == [("a", Grant(until, {"c": 2}))]
    assert "a" not in rounds.reports and rounds.until == until  # its fresh report decides next
    assert "no report from a" in rounds.stalled()


async def test_the_coordinator_waits_for_every_application_to_finish() -> None:
    c = Coordinator(["h0", "h1", "sw"], 1e-6, b"")
    for name in c.names:
        c.attach(name, Outbox())
    finished = trio.Event()

    async def wait() -> None:
        await c.apps_done(["h0", "h1"])
        finished.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(wait)
        for name in ("h0", "sw", "h1"):
            await trio.testing.wait_all_tasks_blocked()
            assert not finished.is_set()
            await c.take(name, Report(math.inf, True, {}, 0, done=True))
        await finished.wait()


def test_a_run_ends_normally_only_on_the_coordinators_word() -> None:
    assert ended_normally(RunOver("h0"))
    assert ended_normally(BaseExceptionGroup("", [BaseExceptionGroup("", [RunOver("h0")])]))
    assert not ended_normally(BaseExceptionGroup("", [RunOver("h0"), SyncError("late")]))
    assert not ended_normally(SyncError("late"))


async def test_a_local_run_s_nodes_join_over_a_unix_socket_removed_afterwards() -> None:
    """``serve(local=True)`` (what ``rocev2-emu up`` does for its own node processes) gives a
    Unix socket's path; a node joins there, proving the secret, and the folder goes with the
    coordinator."""
    from rocev2_emu.fabric.exact_node import join_coordinator

    coordinator = Coordinator(["a"], 1e-6, b"the fabric's secret")
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            where = await nursery.start(partial(coordinator.serve, local=True))
            assert isinstance(where, str) and await trio.Path(where).exists()
            chan = await join_coordinator(where, b"the fabric's secret", 0.0)
            await chan.send(Hello("a").wire())
            await coordinator.connected.wait()
            with pytest.raises(ControlError, match="no coordinator at /"):
                await join_coordinator(where + "-not-there", b"the fabric's secret", 0.0)
            await chan.aclose()
            nursery.cancel_scope.cancel()
    assert not await trio.Path(where).parent.exists()


def test_the_coordinator_holds_a_bounded_number_of_connections_that_never_prove_the_secret() -> (
    None
):
    """2 000 silent connections took a supervisor from 56 to 2 059 open files (issue 59); the
    coordinator now holds at most MAX_UNPROVEN of them, closing the oldest for each newcomer."""
    from rocev2_emu.control.channel import DROPPED, MAX_UNPROVEN

    def dropped() -> float:
        return float(DROPPED.labels(reason="unproven_limit")._value.get())

    before = dropped()
    extra = 8

    async def main() -> None:
        coordinator = Coordinator(["a"], 1e-6, b"secret")
        async with trio.open_nursery() as nursery:
            host, port = await nursery.start(coordinator.serve)
            silent = []
            try:
                for _ in range(MAX_UNPROVEN + extra):
                    silent.append(await trio.open_tcp_stream(host, port))
                for stream in silent[:extra]:  # each newcomer closed the oldest
                    with trio.fail_after(10):
                        while await stream.receive_some():  # the challenge, then the close
                            pass
            finally:
                for stream in silent:
                    await stream.aclose()
                nursery.cancel_scope.cancel()

    trio.run(main)
    assert dropped() == before + extra


def test_a_run_that_stops_moving_is_named_stall_seconds_after_its_last_round() -> None:
    """A process that froze 50 s after the last look of the stall watch was named 60 s later
    than it should have been (the watch looked once per 60 s); now STALL_SECONDS after the
    last round that completed, to the second of the (mock) clock."""
    said: list[float] = []
    why: list[str] = []

    async def main() -> None:
        c = Coordinator(["a", "b"], 1e-6, b"")
        for name in c.names:
            c.attach(name, Outbox())
        c.release()
        await c.take("a", Report(1.0, False, {}, 0))  # b never reports

        async def rounds() -> None:
            try:
                await c.run_rounds()
            except SyncError as exc:
                said.append(trio.current_time())
                why.append(str(exc))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(rounds)
            await trio.sleep(50.0)
            c.moved_at = trio.current_time()  # the run's last round, 50 s in (completed by a
            # report, which decides it in its connection's task: the watch is not woken)
            await trio.sleep(1000.0)
            nursery.cancel_scope.cancel()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert said == [50.0 + STALL_SECONDS]
    assert "no report from b" in why[0]


def test_a_process_of_thousands_of_nodes_is_named_in_one_short_line() -> None:
    """A worker hosting 13 137 nodes was named by all of them: a 100 KB error line."""
    assert process_label("h4") == "h4"
    group = "spine0,leaf0,leaf1,h0,h1,h2,h3"  # a worker of the leaf-spine: named in full
    assert process_label(group) == group
    worker = ",".join(f"h{k}" for k in range(13137))
    assert process_label(worker) == "h0,h1,h2,h3,h4,h5,h6,h7 and 13129 more"
