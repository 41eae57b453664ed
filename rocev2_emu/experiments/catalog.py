"""The built-in scenarios, registered with the harness (``rocev2-emu scenario NAME``)."""

from __future__ import annotations

from rocev2_emu.experiments import (
    dilation,
    fairness,
    fct,
    fluid_model,
    harness,
    incast,
    pfc_unfairness,
    victim_flow,
)

for _module in (pfc_unfairness, victim_flow, incast, fairness, fluid_model, fct, dilation):
    harness.register(_module.SCENARIO)

SCENARIOS = harness.SCENARIOS
