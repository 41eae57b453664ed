"""The progress line of long virtual runs: on a terminal only, with the emulated time, the
frame-hop rate and an ETA when the run knows how far along it is."""

from __future__ import annotations

import io
from dataclasses import dataclass

from rocev2_emu.runtime.progress import ProgressLine


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@dataclass
class FakeEngine:
    now: float = 0.0
    hops: int = 0


def test_no_line_at_all_when_stderr_is_not_a_terminal() -> None:
    assert ProgressLine.on_terminal(stream=io.StringIO()) is None


def test_the_line_shows_emulated_time_rate_and_eta_then_clears() -> None:
    out = Terminal()
    line = ProgressLine.on_terminal(lambda: 0.25, stream=out)
    assert line is not None
    line.show(FakeEngine(now=1234.5e-6, hops=50_000), wall=line.start + 10.0)
    text = out.getvalue()
    assert text.startswith("\rvirtual time 1,234.5 us emulated, 5,000 frame-hops/s, 10 s")
    assert "25% done, ETA 30 s" in text
    line.close()
    assert out.getvalue().endswith("\r")  # the line is blanked for the run's own output
