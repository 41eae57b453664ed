"""Emulated communication against modelled compute: a training step's interconnect tax.

The fabric runs at the TDF; the training script computes in real time on this CPU, which says
nothing about an accelerator.  So the step's compute is a stated model, and only the
communication is measured:

* ``communication``: the emulated seconds of the step's collectives on the fabric, from each
  operation's start in the rank's fabric thread to its end (they run one after another, so
  this is their sum);
* ``compute``: ``compute_ms`` per step (``--compute-ms`` of ``rocev2-emu launch``,
  ``$ROCEV2_COMPUTE_MS``), the accelerator's forward and backward;
* ``overlap``: DDP starts each gradient bucket's all-reduce while backward goes on, so
  communication can hide under backward, which the model takes as 2/3 of the compute (backward
  costs about twice the forward); communication beyond that is ``exposed``;
* the step then lasts ``compute + exposed`` emulated seconds, and the tax is
  ``exposed / compute``.

This is the best case of overlap (every bucket ready at once); exposed communication is a lower
bound.  Operations issued outside DDP's backward (an optimizer's all-gather, a broadcast) count
as communication the same way.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from typing import Any

from collectives.pytorch.worker import FabricWorker

BACKWARD_SHARE = 2 / 3  # of a step's compute: the part DDP overlaps communication with
ENV_COMPUTE_MS = "ROCEV2_COMPUTE_MS"


@dataclass(slots=True, frozen=True)
class StepReport:
    """One step, in emulated seconds (``ops``: the collectives and their emulated seconds)."""

    compute: float
    communication: float
    exposed: float
    step: float
    tax: float
    ops: list[tuple[str, int, float]]

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def model(compute: float, communication: float) -> tuple[float, float, float]:
    """(exposed, step, tax) of a step under the overlap model above."""
    exposed = max(0.0, communication - BACKWARD_SHARE * compute)
    tax = exposed / compute if compute > 0 else float("inf") if exposed > 0 else 0.0
    return exposed, compute + exposed, tax


def end_step(worker: FabricWorker, compute_ms: float | None) -> StepReport:
    if compute_ms is None:
        compute_ms = float(os.environ.get(ENV_COMPUTE_MS) or 0.0)
    if compute_ms < 0:
        raise ValueError(f"compute_ms {compute_ms}: not negative")
    records = worker.take_records()
    compute = compute_ms / 1e3
    communication = sum(r.seconds for r in records)
    exposed, step, tax = model(compute, communication)
    m = worker.step_metrics
    if m is not None:
        m.steps.inc()
        m.compute.set(compute)
        m.communication.set(communication)
        m.exposed.set(exposed)
        m.tax.set(tax if tax != float("inf") else 0.0)
    return StepReport(
        compute, communication, exposed, step, tax, [(r.op, r.nbytes, r.seconds) for r in records]
    )
