"""The intra-server crossbar: an S-byte transfer alone takes S / bandwidth + latency; transfers
sharing a port share its bandwidth max-min fairly; different pairs do not slow each other; one
pair's transfers land in the order they were sent."""

from __future__ import annotations

from functools import partial

import pytest

from rocev2_emu.server.crossbar import PRESETS, Crossbar

B = 100e9  # bytes per second
LAT = 1e-6


def run(xbar: Crossbar, sends: list[tuple[float, int, int, int, str]]) -> dict[str, float]:
    """Send (at, src, dst, size, name) in time order; when each was delivered."""
    landed: dict[str, float] = {}

    def land(name: str) -> None:
        landed[name] = xbar.at

    pending = sorted(sends)
    while pending or xbar.next_time() is not None:
        nxt = xbar.next_time()
        if pending and (nxt is None or pending[0][0] <= nxt):
            at, src, dst, size, name = pending.pop(0)
            xbar.advance(at)
            xbar.send(src, dst, size, at, partial(land, name))
            continue
        assert nxt is not None
        for deliver in xbar.advance(nxt):
            deliver()
    return landed


def test_a_transfer_alone_takes_its_size_over_the_bandwidth_plus_the_latency() -> None:
    landed = run(Crossbar(4, B, LAT), [(0.0, 0, 1, 1 << 20, "a")])
    assert landed["a"] == pytest.approx((1 << 20) / B + LAT, rel=1e-12)


def test_two_transfers_out_of_one_port_share_it() -> None:
    size = 1 << 20
    landed = run(Crossbar(4, B, LAT), [(0.0, 0, 1, size, "a"), (0.0, 0, 2, size, "b")])
    assert landed["a"] == pytest.approx(2 * size / B + LAT, rel=1e-12)
    assert landed["b"] == pytest.approx(2 * size / B + LAT, rel=1e-12)


def test_two_transfers_into_one_port_share_it() -> None:
    size = 1 << 20
    landed = run(Crossbar(4, B, LAT), [(0.0, 0, 2, size, "a"), (0.0, 1, 2, size, "b")])
    assert landed == {
        "a": pytest.approx(2 * size / B + LAT),
        "b": pytest.approx(2 * size / B + LAT),
    }


def test_different_pairs_do_not_slow_each_other() -> None:
    size = 1 << 20
    landed = run(Crossbar(4, B, LAT), [(0.0, 0, 1, size, "a"), (0.0, 2, 3, size, "b")])
    assert landed == {"a": pytest.approx(size / B + LAT), "b": pytest.approx(size / B + LAT)}


def test_a_late_transfer_takes_half_the_port_for_the_time_they_overlap() -> None:
    size = 1 << 20
    half = size / 2 / B  # a is half sent when b starts
    landed = run(Crossbar(4, B, LAT), [(0.0, 0, 1, size, "a"), (half, 0, 2, size, "b")])
    # a's second half at B/2: half + size/B; b's first half at B/2 alongside, the rest alone
    assert landed["a"] == pytest.approx(half + size / B + LAT, rel=1e-12)
    assert landed["b"] == pytest.approx(half + size / B + size / 2 / B + LAT, rel=1e-12)


def test_max_min_fairness_gives_the_spare_to_the_unconstrained_transfer() -> None:
    """a and b leave port 0 (B/2 each); c, into b's port 2 from port 1, gets what b leaves
    of port 2: B/2 as well (port 2 is shared by b and c), so all three land together; d, alone
    from port 3 to port 1, gets all of B."""
    size = 1 << 20
    xbar = Crossbar(4, B, LAT)
    landed = run(
        xbar,
        [
            (0.0, 0, 1, size, "a"),
            (0.0, 0, 2, size, "b"),
            (0.0, 1, 2, size, "c"),
            (0.0, 3, 1, size, "d"),
        ],
    )
    assert landed["d"] == pytest.approx(2 * size / B + LAT, rel=1e-9)  # port 1 in: a and d
    assert landed["a"] == pytest.approx(2 * size / B + LAT, rel=1e-9)
    assert landed["b"] == pytest.approx(2 * size / B + LAT, rel=1e-9)
    assert landed["c"] == pytest.approx(2 * size / B + LAT, rel=1e-9)
    assert xbar.tx_bytes == [2 * size, size, 0, size]
    assert xbar.rx_bytes == [0, 2 * size, 2 * size, 0]


def test_one_pair_delivers_in_order_and_a_flag_costs_the_latency() -> None:
    xbar = Crossbar(2, B, LAT)
    order: list[str] = []
    xbar.send(0, 1, 1 << 20, 0.0, lambda: order.append("big"))
    xbar.send(0, 1, 64, 0.0, lambda: order.append("small"))  # behind the big one, not beside
    xbar.send(1, 0, 0, 0.0, lambda: order.append("flag"))
    while (nxt := xbar.next_time()) is not None:
        for deliver in xbar.advance(nxt):
            deliver()
    assert order == ["flag", "big", "small"]
    assert xbar.at == pytest.approx(((1 << 20) + 64) / B + LAT)


def test_bad_transfers_are_refused() -> None:
    xbar = Crossbar(2, B, LAT)
    with pytest.raises(ValueError, match="port 0 to port 0"):
        xbar.send(0, 0, 1, 0.0, lambda: None)
    with pytest.raises(ValueError, match="port 0 to port 2"):
        xbar.send(0, 2, 1, 0.0, lambda: None)
    with pytest.raises(ValueError, match=r"crossbar of 2 ports, 0\.0 B/s"):
        Crossbar(2, 0.0, LAT)


def test_the_presets_name_their_figures() -> None:
    assert PRESETS["nvlink"].bandwidth_bps == 3600e9  # 450 GB/s each way
    assert PRESETS["pcie"].bandwidth_bps == 504e9
    assert PRESETS["free"].free
    assert "3600 Gb/s" in PRESETS["nvlink"].describe()
