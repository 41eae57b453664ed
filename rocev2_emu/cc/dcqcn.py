"""DCQCN's reaction point: the per-QP rate a sender NIC keeps (Zhu et al., SIGCOMM 2015, §4).

The switch marks (the congestion point, :mod:`switch.pipeline`), the receiver NIC turns marks
into CNPs at most one per ``cnp_interval`` per QP (the notification point,
:mod:`rocev2_emu.nic.core`), and here the sender reacts:

* **Cut**, on a CNP: target ``Rt <- Rc``, current ``Rc <- Rc (1 - alpha/2)`` (not below the
  minimum rate), ``alpha <- (1 - g) alpha + g``; at most one cut per ``decrease_period``.  A cut
  restarts the increase machinery.
* **alpha decay**: every ``alpha_timer`` with no CNP, ``alpha <- (1 - g) alpha`` (computed when
  next needed, so an idle QP costs no timer).
* **Increase events** come from a timer (every ``increase_timer``) and a byte counter (every
  ``byte_counter`` bytes sent; 0 turns it off and the timer's stage stands for both), each
  counting its own stage.  While both stages are below ``F``:
  fast recovery, ``Rc <- (Rt + Rc) / 2``.  When one has reached ``F``: additive increase,
  ``Rt <- Rt + R_AI`` first.  When both have: hyper increase, ``Rt <- Rt + i R_HAI`` with
  ``i = min(stages) - F + 1``.  Rates never exceed the line rate; at line rate the timers stop.

Times are emulated seconds, rates bit/s.  Parameter sets are in :data:`PROFILES`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Final

from rocev2_emu.cc.base import RateControl, RateControlFactory


@dataclass(slots=True, frozen=True)
class DcqcnParams:
    g: float = 1 / 256  # alpha gain
    alpha_timer: float = 55e-6  # K: alpha decays every K without a CNP
    increase_timer: float = 55e-6  # T
    byte_counter: int = 10 * 2**20  # B, bytes
    fast_recovery_steps: int = 5  # F
    rate_ai: float = 40e6  # R_AI, bit/s
    rate_hai: float = 400e6  # R_HAI, bit/s
    min_rate: float = 100e6  # bit/s
    decrease_period: float = 0.0  # at most one cut per period (0: every CNP cuts)
    cnp_interval: float = 50e-6  # notification point: at most one CNP per QP per interval
    initial_alpha: float = 1.0

    def with_overrides(self, **overrides: Any) -> DcqcnParams:
        unknown = set(overrides) - set(self.__dataclass_fields__)
        if unknown:
            raise ValueError(f"unknown DCQCN parameters {sorted(unknown)}")
        return replace(self, **overrides)


PROFILES: Final[dict[str, DcqcnParams]] = {
    # The DCQCN paper (SIGCOMM 2015, §5 and Table 1): g = 1/256, K = T = 55 us, B = 10 MB,
    # F = 5, R_AI = 40 Mbit/s, a CNP per 50 us.  R_HAI (10 x R_AI) and the 100 Mbit/s minimum
    # are this project's choices where the paper gives none.
    "paper": DcqcnParams(),
    # NVIDIA ConnectX-4 and later firmware defaults (NVIDIA's "DCQCN CC Parameters" page, and
    # the mlx5 driver's sysfs defaults): dce_tcp_g 1019/1024 (alpha gain 5/1024), dce_tcp_rtt
    # 1 us (alpha update period), initial_alpha_value 1023/1024, rpg_time_reset 300 us,
    # rpg_byte_reset 32767 B, rpg_threshold 1, rpg_ai_rate 5 Mbit/s, rpg_hai_rate 50 Mbit/s,
    # rpg_min_rate 1 Mbit/s, rate_reduce_monitor_period 4 us, min_time_between_cnps 4 us.
    # rpg_min_dec_fac 50 % and rpg_gd 11 (cut by alpha/2) are what the cut rule does anyway.
    "nvidia": DcqcnParams(
        g=5 / 1024,
        alpha_timer=1e-6,
        increase_timer=300e-6,
        byte_counter=32767,
        fast_recovery_steps=1,
        rate_ai=5e6,
        rate_hai=50e6,
        min_rate=1e6,
        decrease_period=4e-6,
        cnp_interval=4e-6,
        initial_alpha=1023 / 1024,
    ),
    # The ns-3 HPCC simulator's DCQCN (alibaba-edu/High-Precision-Congestion-Control,
    # simulation/run.py, "dcqcn" at 100 Gbit/s): ALPHA_RESUME_INTERVAL 1 us, RATE_DECREASE_INTERVAL
    # 4 us, RP_TIMER 300 us, EWMA_GAIN 1/256, FAST_RECOVERY_TIMES 1, RATE_AI 5 x bw/25 = 20
    # Mbit/s, RATE_HAI 50 x bw/25 = 200 Mbit/s, MIN_RATE 1000 Mbit/s.  Its rate increase runs
    # on the timer alone (byte_counter 0 here).  Its receivers echo CE on every ACK; the 4 us
    # decrease interval makes CNPs closer than that moot, so one per 4 us is sent here.
    "hpcc": DcqcnParams(
        g=1 / 256,
        alpha_timer=1e-6,
        increase_timer=300e-6,
        byte_counter=0,
        fast_recovery_steps=1,
        rate_ai=20e6,
        rate_hai=200e6,
        min_rate=1e9,
        decrease_period=4e-6,
        cnp_interval=4e-6,
    ),
}


class Dcqcn(RateControl):
    def __init__(self, *, line_rate: float, now: float, params: DcqcnParams | None = None) -> None:
        super().__init__(line_rate=line_rate, now=now)
        self.params = p = params or PROFILES["paper"]
        self.target = line_rate
        self.alpha = p.initial_alpha
        self.last_cut = -float("inf")
        self.alpha_ref = now  # alpha has decayed for every whole alpha_timer since this time
        self.increase_deadline: float | None = None
        self.timer_stage = 0
        self.byte_stage = 0
        self.bytes_since = 0
        self.cnps = 0  # rp_cnp_handled
        self.cuts = 0

    # -- events ----------------------------------------------------------------------------
    def on_cnp(self, *, now: float) -> None:
        self.cnps += 1
        p = self.params
        self.alpha = self.alpha_at(now)
        self.alpha_ref = now  # a CNP restarts the decay timer
        if now - self.last_cut < p.decrease_period:
            return
        self.cuts += 1
        self.last_cut = now
        self.target = self.rate
        self.rate = max(p.min_rate, self.rate * (1 - self.alpha / 2))
        self.alpha = (1 - p.g) * self.alpha + p.g
        self.timer_stage = self.byte_stage = self.bytes_since = 0
        self.increase_deadline = now + p.increase_timer

    def alpha_at(self, now: float) -> float:
        """alpha after the decays due by ``now``."""
        periods = int((now - self.alpha_ref) / self.params.alpha_timer + 1e-9)
        return self.alpha * (1 - self.params.g) ** periods if periods > 0 else self.alpha

    def on_sent(self, *, size: int, now: float) -> None:
        super().on_sent(size=size, now=now)
        if self.increase_deadline is None:  # at line rate: nothing to recover
            return
        self.bytes_since += size
        if 0 < self.params.byte_counter <= self.bytes_since:
            self.bytes_since -= self.params.byte_counter
            self.byte_stage += 1
            self._increase()

    def _increase(self) -> None:
        p = self.params
        f = p.fast_recovery_steps
        if p.byte_counter:
            low, high = sorted((self.timer_stage, self.byte_stage))
        else:  # the timer alone, as the HPCC simulator: stage F adds R_AI, later ones R_HAI
            low, high = self.timer_stage - 1, self.timer_stage
        if high >= f:
            step = p.rate_hai * (low - f + 1) if low >= f else p.rate_ai
            self.target = min(self.line_rate, self.target + step)
        self.rate = min(self.line_rate, (self.target + self.rate) / 2)
        if self.target >= self.line_rate and self.rate > self.line_rate * (1 - 1e-6):
            self.rate = self.line_rate  # recovered (halving never lands exactly)
            self.increase_deadline = None

    # -- timers ----------------------------------------------------------------------------
    def get_timer(self) -> float | None:
        return self.increase_deadline

    def handle_timer(self, *, now: float) -> None:
        if self.increase_deadline is not None and now >= self.increase_deadline:
            self.timer_stage += 1
            self.increase_deadline += self.params.increase_timer
            self._increase()  # may find the QP recovered and stop the timer
        if self.rate >= self.line_rate and self.target >= self.line_rate:
            self.increase_deadline = None  # recovered: the increase timer stops


class DcqcnFactory(RateControlFactory):
    """DCQCN with ``params`` on every QP of a NIC."""

    def __init__(self, params: DcqcnParams) -> None:
        self.params = params

    def create(self, line_rate: float, now: float) -> RateControl:
        return Dcqcn(line_rate=line_rate, now=now, params=self.params)
