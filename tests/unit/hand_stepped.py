"""What the hand-stepped harnesses (netsim.py, stepper.py) share: the product's event engine
stepped by hand, without trio.  Tests call the cores directly (a post, a modify), so every step
first services every node, as a hand-stepped harness always did."""

from __future__ import annotations

from rocev2_emu.runtime.engine import Engine, Node


class HandStepped:
    def __init__(self) -> None:
        self.engine = Engine()
        self.nodes: list[Node] = []

    @property
    def now(self) -> float:
        return self.engine.now

    def _kick(self) -> None:
        for node in self.nodes:
            self.engine.kick(node)

    def step(self) -> bool:
        """Advance to the next event; False when nothing is left to happen."""
        self._kick()
        return self.engine.step()

    def advance_to(self, t: float) -> None:
        """Process every event up to emulated time ``t``, then set the clock to ``t``."""
        self._kick()
        self.engine.advance_to(t)
