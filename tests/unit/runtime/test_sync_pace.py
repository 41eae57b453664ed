"""The exact clock's pace and progress line: a paced coordinator waits for the wall clock (in
trio's mock time here) and never changes the windows; the progress line says where the run is
and which process bounds it."""

from __future__ import annotations

import io

import pytest
import trio
import trio.testing

from rocev2_emu.runtime.coordinator import Coordinator
from rocev2_emu.runtime.sync_messages import LinkChange, Report
from tests.unit.runtime.outbox import Outbox


async def test_a_paced_coordinator_waits_until_the_wall_clock_allows_the_window(
    autojump_clock: trio.testing.MockClock,
) -> None:
    c = Coordinator(["a", "b"], 1e-6, b"", pace=1000.0)  # 1 ms of wall per emulated us
    start = trio.current_time()
    c.anchor = (5e-6, start)
    await c.paced(6e-6)  # anchors at 5 us emulated: 1 us on costs 1 ms of wall
    assert trio.current_time() - start == pytest.approx(1e-3)
    await c.paced(6e-6)  # already allowed: no wait
    assert trio.current_time() - start == pytest.approx(1e-3)
    await c.paced(26e-6)  # an idle stretch skipped in one window is still paced
    assert trio.current_time() - start == pytest.approx(21e-3)
    unpaced = Coordinator(["a"], 1e-6, b"")
    await unpaced.paced(1.0)
    assert trio.current_time() - start == pytest.approx(21e-3)


def test_a_pace_must_be_positive() -> None:
    with pytest.raises(ValueError, match="--pace 0"):
        Coordinator(["a"], 1e-6, b"", pace=0)


def test_the_progress_line_names_the_time_reached_and_what_bounds_the_windows() -> None:
    out = io.StringIO()
    c = Coordinator(["h0", "sw0"], 1e-6, b"", pace=50.0, progress=out)
    c.decisions.now, c.decisions.rounds = 123.4e-6, 7
    c.decisions.reports = {"h0": Report(1.0, False, {}, 0), "sw0": Report(0.5, False, {}, 0)}
    c.show_progress()
    line = out.getvalue()
    assert line.startswith("\rclock: exact, 123.4 us emulated, ")
    assert "7 windows, bounded by sw0, paced at 50 s per emulated s" in line
    c.show_progress()  # within half a second: not written again
    assert out.getvalue() == line
    c.clear_progress()
    assert out.getvalue().endswith("\r")
    silent = Coordinator(["h0"], 1e-6, b"")
    silent.show_progress()  # no terminal: no line, nothing to clear
    silent.clear_progress()


async def test_a_round_asked_for_while_one_waits_for_its_pace_is_decided_after_it(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """The report that completes a round decides it in its own connection's task; a change
    asked for while that window waits for its pace is not spun on (the mock clock could not
    jump) but handed out with it, and the watch for stalls decides nothing more until a report
    comes."""
    c = Coordinator(["a", "b"], 1e-6, b"", pace=1000.0)
    chans = {name: Outbox() for name in c.names}
    for name, chan in chans.items():
        c.attach(name, chan)
    c.release()
    for window in (0, 1):  # the poll's reports, then the first window's: the run is at 1 us
        for name in c.names:
            await c.take(name, Report(0.0, False, {}, 0, window=window))
    c.anchor = (1e-6, trio.current_time())  # 1 us on from here: 1 ms of wall
    change = LinkChange(None, (("a", "b"),), False)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(c.run_rounds)
        await trio.testing.wait_all_tasks_blocked()
        await c.take("a", Report(1e-6, False, {}, 0, window=2))
        # as the connection whose report completes the round
        nursery.start_soon(c.take, "b", Report(1.5e-6, False, {"a": 3}, 0, window=2))
        await trio.sleep(0.5e-3)  # the window waits for its pace
        assert [len(chans[n].sent) for n in c.names] == [2, 2]  # the first two grants only
        c.ask("b", [change])  # asks run_rounds for a round meanwhile
        await trio.sleep(1e-3)
        assert [m["until"] for m in chans["a"].sent] == [0.0, 1e-6, 2e-6]
        assert chans["a"].sent[2]["expect"] == {"b": 3} and chans["b"].sent[2]["expect"] == {}
        assert chans["b"].sent[2]["changes"] == [change.at_instant(1e-6).wire()]
        await trio.sleep(10.0)
        assert len(chans["a"].sent) == len(chans["b"].sent) == 3  # no report, no round
        nursery.cancel_scope.cancel()
