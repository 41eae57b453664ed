"""The DCQCN fluid model: RED, the fixed point, and the integration settling on it."""

from __future__ import annotations

import numpy as np
import pytest

from rocev2_emu.cc import PROFILES
from rocev2_emu.experiments.fluid import Bottleneck, fixed_point, integrate

LINK = Bottleneck(10e9, 2, 100e3, 400e3, 0.2, 4154)


def test_red_marking_and_its_inverse() -> None:
    assert LINK.marking(50e3) == 0.0
    assert LINK.marking(250e3) == pytest.approx(0.1)
    assert LINK.marking(500e3) == 1.0
    assert LINK.queue_for(0.1) == pytest.approx(250e3)


@pytest.mark.parametrize("flows", [2, 8])
def test_integration_settles_near_the_fixed_point(flows: int) -> None:
    link = Bottleneck(10e9, flows, 100e3, 400e3, 0.2, 4154)
    dp = PROFILES["paper"]
    p, q, alpha = fixed_point(dp, link)
    assert 0 < p < link.pmax and link.kmin_bytes < q < link.kmax_bytes
    assert alpha == pytest.approx(1 - (1 - p) ** (dp.alpha_timer * 10e9 / flows / 8 / 4154))
    run = integrate(dp, link, 30e-3, dt=1e-6)
    tail = run.times >= 20e-3
    assert np.mean(run.rate[tail]) == pytest.approx(10e9 / flows, rel=0.02)
    # the feedback delay keeps the integrated queue a little below the undelayed fixed point
    assert np.mean(run.queue[tail]) == pytest.approx(q, rel=0.1)


def test_more_flows_need_more_marking() -> None:
    dp = PROFILES["paper"]
    marks = [fixed_point(dp, Bottleneck(10e9, n, 100e3, 400e3, 0.2, 4154))[0] for n in (2, 4, 8)]
    assert marks == sorted(marks) and marks[0] < marks[-1] / 4


def test_no_fixed_point_inside_red_is_an_error() -> None:
    with pytest.raises(ValueError, match="above Kmax"):
        fixed_point(PROFILES["paper"], Bottleneck(10e9, 2, 5e3, 200e3, 0.01, 4154))


def test_the_specified_np_needs_more_marking_for_the_same_cuts() -> None:
    """DCQCN's NP sends a CNP on the first mark a CNP interval after its last: per packet a
    CNP with p_eff = p / (1 + p R tau), so the fixed point holds the paper's p_eff."""
    dp = PROFILES["paper"]
    link = Bottleneck(10e9, 8, 100e3, 400e3, 0.5, 4154)
    p_paper, q_paper, _ = fixed_point(dp, link)
    p, q, _ = fixed_point(dp, link, renewal=True)
    rate = 10e9 / 8 / 8 / 4154  # packets per second per flow
    assert p / (1 + p * rate * dp.cnp_interval) == pytest.approx(p_paper, rel=1e-6)
    assert p > 1.2 * p_paper and q > q_paper
    run = integrate(dp, link, 30e-3, renewal=True)
    tail = run.times >= 20e-3
    assert np.mean(run.queue[tail]) == pytest.approx(q, rel=0.1)
    assert np.mean(run.queue[tail]) > np.mean(integrate(dp, link, 30e-3).queue[tail])
