"""The fabric summary of one job: what it added to counters that ran before it."""

from __future__ import annotations

from typing import Any

from rocev2_emu.fabric.report import merge_stats, stats_delta


def test_a_jobs_share_of_counters_that_ran_before_it() -> None:
    before: dict[str, dict[str, Any]] = {
        "s0": {"pfc_tx": 5, "drops": {"buffer": 3}, "paused_seconds": 1.5, "down_vnis": []},
        "h0": {"retransmitted": 1537, "late_wakeups": 9, "socket_drops": 0},
    }
    after: dict[str, dict[str, Any]] = {
        "s0": {
            "pfc_tx": 5,
            "drops": {"buffer": 3, "ttl": 1},
            "paused_seconds": 2.0,
            "down_vnis": [3],
        },
        "h0": {"retransmitted": 1537, "late_wakeups": 12, "socket_drops": 0},
        "h1": {"retransmitted": 4},  # a node the first reading missed counts from zero
    }
    fab = merge_stats({n: stats_delta(s, before.get(n, {})) for n, s in after.items()})
    assert fab["retransmitted"] == 4  # not 1541: the earlier lossy run is not this job's
    assert fab["late_wakeups"] == 3
    assert fab["drops"] == {"ttl": 1}
    assert fab["pfc_tx"] == 0 and fab["pfc_senders"] == []  # s0's pauses were all before
    assert fab["paused_seconds"] == 0.5


def test_the_fabrics_peak_queue_is_its_deepest_port_not_a_sum() -> None:
    stats = {"s0": {"peak_queue_bytes": 4096}, "s1": {"peak_queue_bytes": 65536}}
    assert merge_stats(stats)["peak_queue_bytes"] == 65536
    # a high-water mark has no "job's share": the delta keeps it as it is
    assert stats_delta({"peak_queue_bytes": 8192}, {"peak_queue_bytes": 4096}) == {
        "peak_queue_bytes": 8192
    }


async def test_late_wake_ups_are_weighed_in_emulated_time() -> None:
    from rocev2_emu.fabric.report import lateness
    from rocev2_emu.runtime.clock import (
        LATE_WALL_SECONDS,
        DilatedClock,
        LatenessMonitor,
        lateness_stats,
    )

    clock = DilatedClock(10000.0, origin=0.0)  # the trio clock (a test of trio_mode)
    monitor = LatenessMonitor(clock, "test node")
    threshold = LATE_WALL_SECONDS / clock.tdf  # 0.5 us of emulated time at TDF 10 000
    monitor.woke(1e-3 + 0.9 * threshold, 1e-3)  # within the threshold: not late
    monitor.woke(2e-3, None)  # no deadline: woken by a datagram
    monitor.woke(3e-3 + 0.8e-6, 3e-3)
    monitor.woke(4e-3 + 3e-6, 4e-3)
    assert monitor.late_wakeups == 2
    assert abs(monitor.late_seconds - 3.8e-6) < 1e-12
    before = lateness_stats(monitor)  # a monitor has what a driver's stats read
    assert before == {
        "late_wakeups": 2,
        "late_seconds": monitor.late_seconds,
        "late_beyond_1us": 1,  # the one 3 us behind
        "late_beyond_10us": 0,
        "late_beyond_100us": 0,
    }
    monitor.woke(5e-3 + 20e-6, 5e-3)  # then a run that had one wake-up 20 us behind
    after = lateness_stats(monitor)
    nodes = {"s0": stats_delta(after, before), "h0": {"late_wakeups": 1, "late_seconds": 2e-6}}
    fab = merge_stats(nodes)  # the run's share: 2 late wake-ups, 22 us behind in all
    assert lateness(fab) == (
        " (11.00 us behind on average; 1 more than 1 us, 1 more than 10 us, 0 more than 100 us;"
        " emulated)"
    )
    assert lateness(merge_stats({"s0": {"late_wakeups": 0}})) == ""
