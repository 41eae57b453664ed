"""A recommendation model's training step (DLRM, Naumov et al. 2019; the seed's MTIA workload) as
a collectives job: embedding tables sharded over the ranks (model parallel), a dense MLP
replicated (data parallel).

Per step, on every rank: the **forward all-to-all** sends each rank the embeddings its samples
looked up in this rank's tables (``batch`` samples per rank x ``tables`` tables per rank x
``dim`` floats, to each peer); the model's compute (``compute_us`` of emulated time, half
forward, half backward: a stand-in for the interaction and the MLPs, which this emulator does
not run); the **backward all-to-all** returns the embeddings' gradients to the ranks that own
the tables; the **all-reduce** of the MLP's gradients (``mlp_bytes``, ring or hierarchical by
``algo``).  The payloads are patterns every receiver checks (values wrong are counted; None in a
timing-only run, which carries no values).

Each rank returns, per step, the emulated seconds of each phase; :func:`summary` gives the
step time (the slowest rank's) and the **interconnect tax** split between the all-to-alls and
the all-reduce (the share of the step each one's mean over the ranks takes).
"""

from __future__ import annotations

import statistics
from typing import Any

import numpy as np

from collectives.comm.communicator import Communicator, tally
from collectives.jobs.registry import job

DEFAULTS: dict[str, Any] = {
    "steps": 3,
    "batch": 128,  # samples per rank
    "tables": 2,  # embedding tables per rank
    "dim": 64,  # floats per embedding
    "mlp_bytes": 2 << 20,  # the dense model's gradients
    "compute_us": 100.0,  # forward + backward compute per step, emulated
    "algo": "ring",  # the MLP all-reduce's schedule
}


def _embeddings(src: int, dst: int, step: int, count: int) -> np.ndarray:
    """What rank ``src`` sends rank ``dst`` in step ``step`` (exact in float32)."""
    return np.full(count, src * 1024 + dst + step * 0.5, np.float32)


@job("dlrm")
async def dlrm(comm: Communicator, params: dict[str, Any]) -> list[dict[str, Any]]:
    """``params``: those of :data:`DEFAULTS`; per step, the seconds of each phase and the
    values wrong."""
    p = DEFAULTS | params
    n, me = comm.size, comm.rank
    per_peer = int(p["batch"]) * int(p["tables"]) * int(p["dim"])
    mlp = np.full(int(p["mlp_bytes"]) // 4, me + 1, np.float32)
    compute = float(p["compute_us"]) * 1e-6
    steps: list[dict[str, Any]] = []
    # the links, made once (as a training job's first step makes them): not timed
    await comm.all_to_all(np.zeros(n, np.float32))
    await comm.all_reduce(np.zeros(n, np.float32), algo=p["algo"])
    await comm.barrier()
    for step in range(int(p["steps"])):
        start = comm.ctx.now()
        out = np.concatenate([_embeddings(me, peer, step, per_peer) for peer in range(n)])
        looked_up = await comm.all_to_all(out)
        t_fwd = comm.ctx.now()
        want = np.concatenate([_embeddings(src, me, step, per_peer) for src in range(n)])
        wrong = [comm.mismatches(looked_up, want)]
        await comm.ctx.sleep(compute)
        t_compute = comm.ctx.now()
        grads = await comm.all_to_all(-looked_up)  # each gradient back to its table's owner
        t_bwd = comm.ctx.now()
        wrong.append(comm.mismatches(grads, -out))
        reduced = await comm.all_reduce(mlp + step, algo=p["algo"])
        end = comm.ctx.now()
        wrong.append(comm.mismatches(reduced, n * (n + 1) / 2 + n * step))
        steps.append(
            {
                "step": end - start,
                "all_to_all": (t_fwd - start) + (t_bwd - t_compute),
                "all_reduce": end - t_bwd,
                "compute": t_compute - t_fwd,
                "wrong": tally(wrong),
            }
        )
    return steps


def summary(results: dict[int, list[dict[str, Any]]]) -> dict[str, Any]:
    """Over steps and ranks: the step time (the slowest rank's, averaged over steps), the
    phases' means, their shares of the step, and the values wrong."""
    ranks = list(results.values())
    steps = len(ranks[0])
    step = statistics.fmean(max(r[s]["step"] for r in ranks) for s in range(steps))

    def mean(key: str) -> float:
        return statistics.fmean(r[s][key] for r in ranks for s in range(steps))

    a2a, ar, compute = mean("all_to_all"), mean("all_reduce"), mean("compute")
    return {
        "step": step,
        "all_to_all": a2a,
        "all_reduce": ar,
        "compute": compute,
        "tax": 1 - compute / step if step else 0.0,
        "a2a_share": a2a / step if step else 0.0,
        "ar_share": ar / step if step else 0.0,
        "wrong": tally(r[s]["wrong"] for r in ranks for s in range(steps)),
    }
