"""The DCQCN fluid model (Zhu, Ghobadi, Misra, Padhye: "ECN or Delay: Lessons Learnt from
Analysis of DCQCN and TIMELY", CoNEXT 2016, section 3), integrated with numpy.

N identical flows share one bottleneck of capacity C behind a RED marker.  Per flow the model
tracks the current rate R_C, the target rate R_T and alpha; the queue q is shared.  Rates are
packets per second, B (the byte counter) is in packets, times are seconds; ``p(t - tau*)`` is
the marking probability the sender hears about one feedback delay late:

* ``dq/dt     = N R_C - C`` (q stays >= 0)
* ``dalpha/dt = g / tau' * ((1 - (1 - p)^(tau' R_C)) - alpha)``
* ``dR_T/dt   = -(R_T - R_C) / tau * (1 - (1 - p)^(tau R_C))
  + R_AI R_C p (1 - p)^(F B) / ((1 - p)^-B - 1)
  + R_AI R_C p (1 - p)^(F T R_C) / ((1 - p)^(-T R_C) - 1)``
* ``dR_C/dt   = -R_C alpha / (2 tau) * (1 - (1 - p)^(tau R_C))
  + (R_T - R_C) / 2 * R_C p / ((1 - p)^-B - 1)
  + (R_T - R_C) / 2 * R_C p / ((1 - p)^(-T R_C) - 1)``

with tau the CNP interval, tau' the alpha timer, T the increase timer and F the fast-recovery
steps of :class:`rocev2_emu.cc.DcqcnParams`.

The model's notification point sends a CNP in every window of tau that holds a marked packet
(``1 - (1 - p)^(tau R_C)``).  DCQCN's NP, as specified and as the NICs here run it, sends one
on the first marked packet at least tau after its last CNP: CNPs are a renewal process, one per
``tau + 1 / (p R_C)``, fewer than the model's.  ``renewal=True`` models that NP: each packet
carries a CNP with probability ``p_eff = p / (1 + p R_C tau)``, which replaces p in every
equation (cuts, alpha, and the increase timer a CNP resets).

:func:`integrate` steps the delay equations
(Euler, a ring buffer for the delayed terms) and :func:`fixed_point` solves the steady state
directly: ``R_C = C / N``, alpha from its equation, and p from the two rate equations by
bisection; the queue follows from inverting RED.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rocev2_emu.cc.dcqcn import DcqcnParams


@dataclass(slots=True, frozen=True)
class Bottleneck:
    capacity_bps: float
    flows: int
    kmin_bytes: float
    kmax_bytes: float
    pmax: float
    packet_bytes: int  # bytes on the wire per data packet
    feedback_delay: float = 4e-6  # tau*: marking to reaction, seconds

    def marking(self, q_bytes: np.ndarray | float) -> np.ndarray:
        """RED's marking probability at queue depth ``q_bytes``."""
        q = np.asarray(q_bytes, dtype=float)
        ramp = (q - self.kmin_bytes) / (self.kmax_bytes - self.kmin_bytes) * self.pmax
        return np.where(q <= self.kmin_bytes, 0.0, np.where(q > self.kmax_bytes, 1.0, ramp))

    def queue_for(self, p: float) -> float:
        """The queue depth (bytes) at which RED marks with probability ``p`` (< pmax)."""
        return self.kmin_bytes + p / self.pmax * (self.kmax_bytes - self.kmin_bytes)


@dataclass(slots=True, frozen=True)
class FluidResult:
    times: np.ndarray  # seconds
    queue: np.ndarray  # bytes
    rate: np.ndarray  # bit/s, per flow
    alpha: np.ndarray


def _increase_rates(
    p: np.ndarray, rc: np.ndarray, dp: DcqcnParams, b_pkts: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Rates of byte-counter and timer increase events, and the fractions of each past F."""
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        q = 1.0 - p
        tr = dp.increase_timer * rc
        byte_ev = np.where(p > 0, rc * p / (q**-b_pkts - 1.0), rc / b_pkts)
        timer_ev = np.where(p > 0, rc * p / (q**-tr - 1.0), 1.0 / dp.increase_timer)
        byte_ai = byte_ev * q ** (dp.fast_recovery_steps * b_pkts)
        timer_ai = timer_ev * q ** (dp.fast_recovery_steps * tr)
    return byte_ev, timer_ev, byte_ai, timer_ai


def _derivatives(
    rc: np.ndarray,
    rt: np.ndarray,
    alpha: np.ndarray,
    p_late: np.ndarray,
    rc_late: np.ndarray,
    dp: DcqcnParams,
    b_pkts: float,
    rai: float,
    renewal: bool,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    if renewal:
        p_late = p_late / (1.0 + p_late * rc_late * dp.cnp_interval)
    q = 1.0 - p_late
    cut = 1.0 - q ** (dp.cnp_interval * rc_late)  # a CNP within tau
    heard = 1.0 - q ** (dp.alpha_timer * rc_late)  # a CNP within tau'
    byte_ev, timer_ev, byte_ai, timer_ai = _increase_rates(p_late, rc_late, dp, b_pkts)
    d_alpha = dp.g / dp.alpha_timer * (heard - alpha)
    d_rt = -(rt - rc) / dp.cnp_interval * cut + rai * (byte_ai + timer_ai)
    d_rc = -rc * alpha / (2 * dp.cnp_interval) * cut + (rt - rc) / 2 * (byte_ev + timer_ev)
    return d_rc, d_rt, d_alpha


def integrate(
    dp: DcqcnParams,
    link: Bottleneck,
    duration: float,
    dt: float = 0.5e-6,
    *,
    renewal: bool = False,
) -> FluidResult:
    """Integrate from every flow at line rate, alpha 1 and an empty queue (``renewal``: the
    specified NP's CNPs, the module)."""
    pkt_bits = link.packet_bytes * 8
    c = link.capacity_bps / pkt_bits  # packets per second
    b_pkts = dp.byte_counter / link.packet_bytes
    rai = dp.rate_ai / pkt_bits
    steps = int(duration / dt)
    lag = max(1, round(link.feedback_delay / dt))
    rc = np.array(c)
    rt = np.array(c)
    alpha = np.array(dp.initial_alpha)
    qb = 0.0
    hist_p = np.zeros(lag)
    hist_rc = np.full(lag, c)
    times = np.arange(steps) * dt
    queue, rate, alphas = np.empty(steps), np.empty(steps), np.empty(steps)
    floor = dp.min_rate / pkt_bits
    for k in range(steps):
        slot = k % lag
        p_late, rc_late = hist_p[slot], hist_rc[slot]
        d_rc, d_rt, d_alpha = _derivatives(rc, rt, alpha, p_late, rc_late, dp, b_pkts, rai, renewal)
        rc = np.clip(rc + d_rc * dt, floor, c)
        rt = np.clip(rt + d_rt * dt, floor, c)
        alpha = np.clip(alpha + d_alpha * dt, 0.0, 1.0)
        qb = max(0.0, qb + (link.flows * float(rc) - c) * dt * link.packet_bytes)
        hist_p[slot] = float(link.marking(qb))
        hist_rc[slot] = rc
        queue[k], rate[k], alphas[k] = qb, float(rc) * pkt_bits, float(alpha)
    return FluidResult(times, queue, rate, alphas)


def fixed_point(
    dp: DcqcnParams, link: Bottleneck, *, renewal: bool = False
) -> tuple[float, float, float]:
    """(marking probability, queue in bytes, alpha) where every derivative is zero
    (``renewal``: the specified NP's, whose equations are the model's in ``p_eff``)."""
    pkt_bits = link.packet_bytes * 8
    rc = np.array(link.capacity_bps / pkt_bits / link.flows)
    b_pkts = dp.byte_counter / link.packet_bytes
    rai = dp.rate_ai / pkt_bits

    def excess(p: float) -> float:
        # With R_T - R_C from dR_T/dt = 0, dR_C/dt = 0 reads alpha cut^2 = tau^2 R_AI X Y
        # (X: the additive-increase event rate, Y: all increase events); > 0: p too high.
        pa = np.array(p)
        cut = 1.0 - (1.0 - p) ** (dp.cnp_interval * rc)
        alpha = 1.0 - (1.0 - p) ** (dp.alpha_timer * rc)
        byte_ev, timer_ev, byte_ai, timer_ai = _increase_rates(pa, rc, dp, b_pkts)
        gap = dp.cnp_interval * rai * (byte_ai + timer_ai) / cut  # R_T - R_C
        return float(rc * alpha / (2 * dp.cnp_interval) * cut - gap / 2 * (byte_ev + timer_ev))

    lo, hi = 1e-9, link.pmax
    if excess(hi) < 0:
        raise ValueError(f"no fixed point with p < pmax {link.pmax}: the queue sits above Kmax")
    for _ in range(200):
        mid = (lo * hi) ** 0.5
        lo, hi = (mid, hi) if excess(mid) < 0 else (lo, mid)
    p = (lo * hi) ** 0.5
    alpha = 1.0 - (1.0 - p) ** (dp.alpha_timer * float(rc))
    if renewal:  # the equations held p_eff: the marking that gives it
        p = p / (1.0 - p * float(rc) * dp.cnp_interval)
        if not 0 < p < link.pmax:
            raise ValueError(f"no fixed point with p < pmax {link.pmax}: the queue sits above Kmax")
    return p, link.queue_for(p), alpha
