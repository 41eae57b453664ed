"""DCQCN's reaction point against hand-computed traces, and CNPs end to end in a fabric."""

from __future__ import annotations

import tomllib

import pytest

from rocev2_emu.cc import (
    PROFILES,
    Dcqcn,
    DcqcnFactory,
    DcqcnParams,
    LineRate,
    LineRateFactory,
    StaticRate,
    StaticRateFactory,
)
from rocev2_emu.topology.file import parse
from rocev2_emu.topology.generate import single_switch
from tests.unit.netsim import NetSim
from tests.unit.switch.test_switch import connect, finish, start

G = 1e9


def test_a_cnp_cuts_by_half_alpha_and_raises_alpha() -> None:
    rp = Dcqcn(
        line_rate=100 * G, now=0.0, params=PROFILES["paper"].with_overrides(initial_alpha=0.5)
    )
    rp.on_cnp(now=0.0)
    assert rp.target == 100 * G
    assert rp.rate == pytest.approx(100 * G * (1 - 0.5 / 2))  # 75 Gbit/s
    assert rp.alpha == pytest.approx((1 - 1 / 256) * 0.5 + 1 / 256)
    rp.on_cnp(now=10e-6)  # within K: no decay before the update
    assert rp.target == pytest.approx(75 * G)
    a1 = (1 - 1 / 256) * 0.5 + 1 / 256
    assert rp.rate == pytest.approx(75 * G * (1 - a1 / 2))
    assert rp.alpha == pytest.approx((1 - 1 / 256) * a1 + 1 / 256)


def test_alpha_decays_every_k_without_cnps() -> None:
    rp = Dcqcn(line_rate=100 * G, now=0.0)
    rp.on_cnp(now=0.0)
    alpha = rp.alpha  # 1.0 with the paper's initial alpha
    assert rp.alpha_at(54e-6) == alpha
    assert rp.alpha_at(55e-6) == pytest.approx(alpha * 255 / 256)
    assert rp.alpha_at(3 * 55e-6 + 1e-6) == pytest.approx(alpha * (255 / 256) ** 3)
    rp.on_cnp(now=120e-6)  # two decays, then the CNP's update
    assert rp.alpha == pytest.approx(alpha * (255 / 256) ** 2 * (255 / 256) + 1 / 256)


def test_recovery_stages_fast_recovery_then_additive_then_back_to_line_rate() -> None:
    p = PROFILES["paper"]
    rp = Dcqcn(line_rate=100 * G, now=0.0, params=p)
    rp.on_cnp(now=0.0)  # Rt = 100, Rc = 50
    rates: list[tuple[int, float, float]] = []
    t = rp.get_timer()
    while t is not None and len(rates) < 200:
        rp.handle_timer(now=t)
        rates.append((rp.timer_stage, rp.target / G, rp.rate / G))
        t = rp.get_timer()
    # F = 5 timer events of fast recovery: Rc halves its distance to Rt = 100 each time
    assert [r[2] for r in rates[:4]] == pytest.approx([75.0, 87.5, 93.75, 96.875])
    assert all(r[1] == 100.0 for r in rates)  # the target is already the line rate
    assert rates[-1][2] == 100.0 and rp.get_timer() is None  # back at line rate, timer stops
    assert len(rates) < 40


def test_additive_and_hyper_increase_raise_the_target() -> None:
    p = PROFILES["paper"].with_overrides(byte_counter=1000, fast_recovery_steps=2)
    rp = Dcqcn(line_rate=100 * G, now=0.0, params=p)
    rp.on_cnp(now=0.0)
    rp.on_cnp(now=1e-6)  # Rt = 50, Rc = 25
    assert (rp.target, rp.rate) == (50 * G, 25 * G)
    rp.handle_timer(now=56e-6)  # timer stage 1: fast recovery
    assert (rp.target, rp.rate) == (50 * G, 37.5 * G)
    rp.handle_timer(now=111e-6)  # timer stage 2 = F, byte stage 0: additive (+R_AI)
    assert rp.target == pytest.approx(50 * G + p.rate_ai)
    assert rp.rate == pytest.approx((50 * G + p.rate_ai + 37.5 * G) / 2)
    before = rp.target
    rp.on_sent(size=1000, now=112e-6)  # byte stage 1: still additive
    rp.on_sent(size=1000, now=113e-6)  # byte stage 2: both at F: hyper, i = 1
    assert rp.target == pytest.approx(before + p.rate_ai + p.rate_hai)


def test_hpcc_profile_increases_on_its_timer_alone() -> None:
    p = PROFILES["hpcc"]
    rp = Dcqcn(line_rate=100 * G, now=0.0, params=p)
    rp.on_cnp(now=0.0)  # alpha starts at 1: the rate halves
    assert (rp.rate, rp.target) == (50 * G, 100 * G)
    rp.on_sent(size=10 << 20, now=1e-6)  # no byte counter: bytes change nothing
    assert rp.rate == 50 * G
    assert rp.get_timer() == pytest.approx(300e-6)
    rp.handle_timer(now=300e-6)  # timer stage 1 = F: additive increase
    assert rp.target == pytest.approx(100 * G)  # clamped at line rate
    assert rp.rate == pytest.approx(75 * G)
    rp.on_cnp(now=400e-6)  # alpha has decayed 400 times by (1 - 1/256) since the last cut
    alpha = 1.0 * (1 - p.g) ** 400
    assert rp.rate == pytest.approx(75 * G * (1 - alpha / 2))
    assert rp.alpha == pytest.approx((1 - p.g) * alpha + p.g)
    cut = rp.rate
    rp.handle_timer(now=700e-6)  # stage 1: additive, R_AI on the target
    assert rp.target == pytest.approx(75 * G + p.rate_ai)
    assert rp.rate == pytest.approx((75 * G + p.rate_ai + cut) / 2)
    before = rp.target
    rp.handle_timer(now=1000e-6)  # stage 2: hyper increase
    assert rp.target == pytest.approx(before + p.rate_hai)


def test_at_most_one_cut_per_decrease_period_and_the_minimum_rate() -> None:
    p = PROFILES["nvidia"]
    rp = Dcqcn(line_rate=100 * G, now=0.0, params=p)
    for t in (0.0, 1e-6, 2e-6, 3e-6):
        rp.on_cnp(now=t)
    assert rp.cuts == 1 and rp.cnps == 4
    rp.on_cnp(now=4e-6)
    assert rp.cuts == 2
    for k in range(200):
        rp.on_cnp(now=10e-6 + k * 5e-6)
    assert rp.rate == p.min_rate


def test_factories_make_each_qps_rate_control_and_overrides_are_checked() -> None:
    hpcc = PROFILES["hpcc"]
    dcqcn = DcqcnFactory(hpcc).create(G, 0.0)
    assert isinstance(dcqcn, Dcqcn) and dcqcn.params is hpcc
    assert isinstance(LineRateFactory().create(G, 0.0), LineRate)
    paced = StaticRateFactory(G / 4).create(G, 0.0)
    assert isinstance(paced, StaticRate) and paced.rate == G / 4
    assert StaticRateFactory(4 * G).create(G, 0.0).rate == G  # at most the line rate
    with pytest.raises(ValueError, match=r"pacing rate 0\.0 bit/s must be > 0"):
        StaticRateFactory(0.0)
    with pytest.raises(ValueError, match="unknown DCQCN parameters"):
        DcqcnParams().with_overrides(k=1)


def test_incast_with_dcqcn_sends_cnps_and_cuts_rates() -> None:
    data = tomllib.loads(single_switch(5))
    t = parse(data, "incast.toml")
    sim = NetSim(t)
    for nic in sim.nics.values():  # DCQCN on at every NIC: notification and reaction
        nic.config.rate_control = DcqcnFactory(PROFILES["paper"])
        nic.config.send_cnps = True
    flows = [connect(sim, f"h{i}", "h4", 2 << 20, i) for i in range(4)]
    counts = [start(f) for f in flows]
    finish(sim, flows, counts)
    assert sim.nics["h4"].counters.np_cnp_sent > 0
    handled = [sim.nics[f"h{i}"].counters.rp_cnp_handled for i in range(4)]
    assert all(n > 0 for n in handled)
    rates = [f.qp.rc.rate for f in flows]  # type: ignore[union-attr]
    assert min(rates) < 100 * G  # rates were cut
    assert sim.switches["sw0"].ports[4].ecn_marked[3] > 0
