"""The rate-control interface, the trivial implementations (line rate, no reaction; a fixed
pacing rate), and the factory a NIC is configured with."""

from __future__ import annotations

import abc


class RateControl(abc.ABC):
    """Per-QP sending rate, driven by keyword-only hooks that take ``now`` (emulated s)."""

    def __init__(self, *, line_rate: float, now: float) -> None:
        self.line_rate = line_rate
        self.rate = line_rate  # bit/s the QP may send at now
        self.next_send_time = now
        self.catchup = 0.0  # as the NIC's link pacing: a late pump may send this far behind

    def on_sent(self, *, size: int, now: float) -> None:
        """A frame of ``size`` bytes left: space the next one by the current rate (at line
        rate the link's own pacing is the limit, so the QP adds none)."""
        if self.rate >= self.line_rate:
            self.next_send_time = now
            return
        late = now - self.next_send_time
        # on schedule, or a late pump keeping its schedule; after idling, or coming down from
        # line rate, a new schedule starts now (no burst credit for the time not sent)
        start = self.next_send_time if 0 <= late <= self.catchup else max(now, self.next_send_time)
        self.next_send_time = start + size * 8 / self.rate

    @abc.abstractmethod
    def on_cnp(self, *, now: float) -> None: ...

    @abc.abstractmethod
    def get_timer(self) -> float | None: ...

    @abc.abstractmethod
    def handle_timer(self, *, now: float) -> None: ...


class LineRate(RateControl):
    """No rate control: PFC-only runs.  CNPs are counted by the NIC and otherwise ignored."""

    def on_sent(self, *, size: int, now: float) -> None:
        self.next_send_time = now  # the NIC's link pacing is the only limit

    def on_cnp(self, *, now: float) -> None:
        pass

    def get_timer(self) -> float | None:
        return None

    def handle_timer(self, *, now: float) -> None:
        pass


class StaticRate(LineRate):
    """NIC pacing: every QP sends at a fixed ``rate`` (bit/s, at most the line rate), as a
    sender told its fair share up front would (the seed's "packet pacing" for incast).  Like
    :class:`LineRate` it ignores CNPs; unlike it, it spaces the QP's frames."""

    def __init__(self, *, line_rate: float, now: float, rate: float) -> None:
        super().__init__(line_rate=line_rate, now=now)
        if rate <= 0:
            raise ValueError(f"pacing rate {rate} bit/s must be > 0")
        self.rate = min(rate, line_rate)

    def on_sent(self, *, size: int, now: float) -> None:
        # defined, not assigned (on_sent = RateControl.on_sent): a compiled class dispatches
        # through its own method table and ignored the assignment
        RateControl.on_sent(self, size=size, now=now)


class RateControlFactory(abc.ABC):
    """Makes every QP's rate control of one NIC: chosen once, when the NIC is configured, and
    called with typed arguments when a QP becomes ready to send (no name looked up, no keyword
    arguments gathered per QP)."""

    @abc.abstractmethod
    def create(self, line_rate: float, now: float) -> RateControl: ...


class LineRateFactory(RateControlFactory):
    """No rate control (:class:`LineRate`)."""

    def create(self, line_rate: float, now: float) -> RateControl:
        return LineRate(line_rate=line_rate, now=now)


class StaticRateFactory(RateControlFactory):
    """NIC pacing at ``rate`` bit/s (:class:`StaticRate`)."""

    def __init__(self, rate: float) -> None:
        if not rate > 0:
            raise ValueError(f"pacing rate {rate} bit/s must be > 0")
        self.rate = rate

    def create(self, line_rate: float, now: float) -> RateControl:
        return StaticRate(line_rate=line_rate, now=now, rate=self.rate)
