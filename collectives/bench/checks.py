"""Jobs that check the collectives against numpy: every op, dtype and awkward size.

Every rank builds every rank's input from a seeded generator (so each can compute the
expected result itself) and compares what the collective returned; the job returns the
mismatches it found, as text, so a multi-process run can report them.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from collectives.comm import ops
from collectives.comm.communicator import Communicator
from collectives.jobs.registry import job

DTYPES = (np.float16, np.float32, np.float64, np.int32, np.int64)


def rank_input(rank: int, count: int, dtype: Any, seed: int, op: str) -> np.ndarray:
    rng = np.random.default_rng([seed, rank, count])
    dt = np.dtype(dtype)
    if dt.kind == "f":
        # prod of many ranks stays finite near 1; small integers keep float sums exact enough
        values = rng.uniform(0.9, 1.1, count) if op == "prod" else rng.integers(-8, 9, count)
    else:
        values = rng.integers(1, 3, count) if op == "prod" else rng.integers(-1000, 1000, count)
    return values.astype(dt)


def _close(got: np.ndarray, want: np.ndarray) -> bool:
    if got.shape != want.shape or got.dtype != want.dtype:
        return False
    if got.dtype.kind == "f":
        tol = 1e-2 if got.dtype == np.float16 else 1e-5
        return bool(np.allclose(got, want, rtol=tol, atol=tol))
    return bool(np.array_equal(got, want))


@job("check")
async def check(comm: Communicator, params: dict[str, Any]) -> list[str]:
    """Every op x dtype x size in ``params`` (sizes, dtypes, ops, seed): all-reduce by ring
    (out of place) and hierarchically (in place, when hosts hold several ranks), reduce,
    reduce-scatter, all-gather and broadcast (from a root that moves with the size); and per
    dtype x size: all-to-all (``size`` elements per peer), all-to-all-v (counts that differ
    per pair, zeros among them), send/recv between neighbours and a ring shift (send_recv)."""
    n, r = comm.size, comm.rank
    seed = int(params.get("seed", 1))
    sizes = [int(x) for x in params.get("sizes", [0, 1, 2, n - 1, n + 1, 1000, 12345])]
    dtypes = [np.dtype(d) for d in params.get("dtypes", [np.dtype(d).name for d in DTYPES])]
    op_names = list(params.get("ops", ops.OPS))
    which = set(
        params.get(
            "collectives",
            ["all_reduce", "reduce", "reduce_scatter", "all_gather", "broadcast", "p2p"],
        )
    )
    bad: list[str] = []

    def expect(what: str, got: np.ndarray, want: np.ndarray) -> None:
        if not _close(got, want):
            bad.append(f"rank {r}: {what}: got {got[:4]}... want {want[:4]}...")

    for dtype in dtypes:
        for count in sizes:
            for op in op_names:
                inputs = [rank_input(k, count, dtype, seed, op) for k in range(n)]
                want = ops.reference(op, inputs)
                if "all_reduce" in which:
                    got = await comm.all_reduce(inputs[r], op, algo="ring")
                    expect(f"all_reduce ring {op} {dtype} x{count}", got, want)
                if "all_reduce" in which and comm.hierarchy.levels:
                    mine = inputs[r].copy()
                    await comm.all_reduce(mine, op, out=mine, algo="hierarchical")
                    expect(f"all_reduce hierarchical in-place {op} {dtype} x{count}", mine, want)
                if "all_reduce" in which:
                    got = await comm.all_reduce(inputs[r], op, algo="tree")
                    expect(f"all_reduce tree {op} {dtype} x{count}", got, want)
                if "reduce" in which:
                    got = await comm.reduce(inputs[r], root=0, op=op)
                    if r == 0:
                        expect(f"reduce {op} {dtype} x{count}", got, want)
                if "reduce_scatter" not in which:
                    continue
                blocks = [rank_input(k, count * n, dtype, seed, op) for k in range(n)]
                got = await comm.reduce_scatter(blocks[r], op)
                full = ops.reference(op, blocks)
                expect(
                    f"reduce_scatter {op} {dtype} x{count}", got, full[r * count : (r + 1) * count]
                )
            inputs = [rank_input(k, count, dtype, seed, "sum") for k in range(n)]
            if "all_gather" in which:
                got = await comm.all_gather(inputs[r])
                expect(f"all_gather {dtype} x{count}", got, np.concatenate(inputs))
            root = count % n
            if "broadcast" in which:
                got = await comm.broadcast(inputs[r], root=root)
                expect(f"broadcast root {root} {dtype} x{count}", got, inputs[root])
            if "p2p" in which:
                await _check_p2p(comm, count, dtype, seed, expect)
    await comm.barrier()
    return bad


def v_counts(src: int, dst: int, count: int) -> int:
    """What rank ``src`` sends rank ``dst`` in the all-to-all-v check: differs per pair."""
    return (src + 2 * dst + count) % 4 * count // 2 + (src * dst) % 3


async def _check_p2p(comm: Communicator, count: int, dtype: Any, seed: int, expect: Any) -> None:
    n, r = comm.size, comm.rank
    blocks = [rank_input(k, count * n, dtype, seed, "sum") for k in range(n)]
    got = await comm.all_to_all(blocks[r])
    want = np.concatenate([blocks[k][r * count : (r + 1) * count] for k in range(n)])
    expect(f"all_to_all {dtype} x{count}", got, want)

    sends = [v_counts(r, j, count) for j in range(n)]
    recvs = [v_counts(i, r, count) for i in range(n)]
    mine = rank_input(r, sum(sends), dtype, seed + 1, "sum")
    got = await comm.all_to_all_v(mine, sends, recvs)
    parts = []
    for i in range(n):  # what rank i sent rank r: its slice for r
        theirs = rank_input(i, sum(v_counts(i, j, count) for j in range(n)), dtype, seed + 1, "sum")
        at = sum(v_counts(i, j, count) for j in range(r))
        parts.append(theirs[at : at + recvs[i]])
    expect(f"all_to_all_v {dtype} x{count}", got, np.concatenate(parts))

    inputs = [rank_input(k, count, dtype, seed + 2, "sum") for k in range(n)]
    if n > 1:
        got = await comm.send_recv(inputs[r], (r + 1) % n, np.empty(count, dtype), (r - 1) % n)
        expect(f"send_recv shift {dtype} x{count}", got, inputs[(r - 1) % n])
    if r % 2 == 0 and r + 1 < n:  # pairs (0, 1), (2, 3), ...: the even rank sends twice
        await comm.send(inputs[r], r + 1)
        await comm.send(inputs[r][::-1].copy(), r + 1)
    elif r % 2 == 1:
        first = await comm.recv(np.empty(count, dtype), r - 1)
        second = await comm.recv(np.empty(count, dtype), r - 1)
        expect(f"send/recv {dtype} x{count}", first, inputs[r - 1])
        expect(f"send/recv second {dtype} x{count}", second, inputs[r - 1][::-1])


@job("stop")
async def stop_at(comm: Communicator, params: dict[str, Any]) -> str:
    """All-reduces (or ``params["op"]``: ``all_to_all``) until rank ``params["rank"]`` stops
    taking part before operation ``params["at"]`` (it leaves, as a crashed rank would); the
    others must raise."""
    x = np.ones(int(params.get("count", 4096)) // comm.size * comm.size, np.float32)
    op = comm.all_to_all if params.get("op") == "all_to_all" else comm.all_reduce
    for k in range(int(params["at"]) + 1):
        if comm.rank == int(params["rank"]) and k == int(params["at"]):
            return "stopped"
        try:
            await op(x)
        except Exception as exc:
            return f"{type(exc).__name__} at {comm.ctx.now() * 1e3:.3f} ms: {exc}"
    return "finished"
