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
    from rocev2_emu.runtime.clock import LATE_WALL_SECONDS, DilatedClock, LatenessMonitor

    clock = DilatedClock(10000.0, origin=0.0)  # the trio clock (a test of trio_mode)
    monitor = LatenessMonitor(clock, "test node")
    threshold = LATE_WALL_SECONDS / clock.tdf  # 0.5 us of emulated time at TDF 10 000
    monitor.woke(1e-3 + 0.9 * threshold, 1e-3)  # within the threshold: not late
    monitor.woke(2e-3, None)  # no deadline: woken by a datagram
    monitor.woke(3e-3 + 1e-6, 3e-3)
    monitor.woke(4e-3 + 3e-6, 4e-3)
    assert monitor.late_wakeups == 2
    assert abs(monitor.late_seconds - 4e-6) < 1e-12 and abs(monitor.peak_lateness - 3e-6) < 1e-12

    nodes = {  # two nodes' stats as switch_stats / host_stats give them
        "s0": {"late_wakeups": 2, "late_seconds": 4e-6, "peak_lateness_seconds": 3e-6},
        "h0": {"late_wakeups": 2, "late_seconds": 12e-6, "peak_lateness_seconds": 10e-6},
    }
    fab = merge_stats(nodes)
    assert lateness(fab) == " (4.00 us behind on average, the worst 10.00 us; emulated)"
    assert lateness(merge_stats({"s0": {"late_wakeups": 0}})) == ""
