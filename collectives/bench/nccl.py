"""``rocev2-emu bench all-reduce`` (and all-gather, reduce-scatter, broadcast, all-to-all,
sendrecv): nccl-tests.

Flags and output follow NVIDIA's nccl-tests: sizes from ``-b`` to ``-e`` by factor ``-f``,
``-n`` timed iterations after ``-w`` warm-up ones, ``-c`` checks the results, ``-o`` the
reduction, ``-d`` the type, ``-r`` the root; one line per size with the out-of-place and the
in-place time, algbw and busbw, and the count of wrong elements; then ``# Out of bounds
values`` and ``# Avg bus bandwidth``.  algbw = size / time; busbw = algbw x 2(n-1)/n for
all-reduce, (n-1)/n for all-gather, reduce-scatter and all-to-all, 1 for broadcast and
sendrecv (nccl-tests' doc/PERFORMANCE.md).  all-to-all's size is what each rank sends in all
(size / n to each peer, rounded down to whole elements as nccl-tests does); sendrecv's is what
each rank sends its successor (rank r + 1) while it receives from its predecessor.  Times are
emulated microseconds: each rank times its ``-n`` operations from a common barrier, and the
line shows the slowest rank's mean (the collective is done when its last rank is).  After the
table comes the fabric summary: pauses, ECN marks, CNPs, retransmissions and drops - the
interconnect tax.

Inputs follow a pattern every rank can reproduce, so each rank checks its own result exactly
(``(rank + i) mod 5``, and for ``prod`` 1 or 2, so every product is exact).
"""

from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np

from collectives.comm import ops
from collectives.comm.communicator import BUS_FACTOR, Communicator
from collectives.jobs.registry import job
from rocev2_emu.fabric.report import lateness

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all", "send_recv")
SPLIT = ("all_gather", "reduce_scatter", "all_to_all")  # size is n blocks: a count per block


def sizes(minbytes: int, maxbytes: int, factor: int) -> list[int]:
    out, size = [], minbytes
    while size <= maxbytes:
        out.append(size)
        if factor <= 1:
            break
        size = size * factor if size else 1  # -b 0: then 1, 4, 16, ...
    return out


def params(sizes: list[int], coll: str = "all_reduce", **overrides: Any) -> dict[str, Any]:
    """The ``bench`` job's parameters: nccl-tests' defaults for what ``overrides`` leaves out
    (one timed iteration, no warm-up, checked, sum of floats, root 0, algorithm auto)."""
    p = {"coll": coll, "sizes": sizes, "iters": 1, "warmup": 0, "check": True, "op": "sum"}
    p |= {"dtype": "float", "root": 0, "algo": "auto", "order": "topology"}
    tuning = {"timeout", "qp_timeout", "slots", "slot_bytes", "qps_per_connection", "grant_dscp"}
    unknown = set(overrides) - set(p) - tuning
    if unknown:
        raise ValueError(f"unknown bench parameters {sorted(unknown)}")
    return p | overrides


PATTERN_PERIOD = 5


def pattern(rank: int, count: int, dtype: np.dtype, op: str, offset: int = 0) -> np.ndarray:
    """Rank ``rank``'s input: small integers (exact in every dtype), period PATTERN_PERIOD."""
    i = np.arange(offset, offset + count, dtype=np.int64)
    m = (rank + i) % PATTERN_PERIOD
    values = 1 + (m == 0) if op == "prod" else m
    out: np.ndarray = values.astype(dtype)
    return out


def expected(
    coll: str, n: int, count: int, dtype: np.dtype, op: str, rank: int, root: int
) -> np.ndarray:
    """What rank ``rank`` must hold after ``coll`` on ``count`` elements per rank."""
    if coll == "all_gather":  # block k is rank k's input
        return _blocks(n, count, 0, dtype, op)
    if coll == "broadcast":
        return pattern(root, count, dtype, op)
    if coll == "all_to_all":  # block k from rank k: its block for this rank
        return _blocks(n, count, rank * count, dtype, op)
    if coll == "send_recv":
        return pattern((rank - 1) % n, count, dtype, op)
    total = count * n if coll == "reduce_scatter" else count
    # every pattern repeats with period PATTERN_PERIOD: reduce one period, then repeat it
    period = min(total, PATTERN_PERIOD)
    acc = np.tile(_reduced_period(n, period, dtype.str, op), -(-total // period))[:total]
    return acc[rank * count : (rank + 1) * count] if coll == "reduce_scatter" else acc


def _blocks(n: int, count: int, offset: int, dtype: np.dtype, op: str) -> np.ndarray:
    """Block k (k < n) is ``pattern(k, count, offset=offset)``, in one array operation: rank
    k's pattern is the first rank's shifted by k (a period of PATTERN_PERIOD)."""
    k = np.arange(n, dtype=np.int64)[:, None]
    i = np.arange(offset, offset + count, dtype=np.int64)[None, :]
    m = (k + i) % PATTERN_PERIOD
    values = 1 + (m == 0) if op == "prod" else m
    out: np.ndarray = values.astype(dtype).reshape(-1)
    return out


@functools.lru_cache(maxsize=16)
def _reduced_period(n: int, period: int, dtype: str, op: str) -> np.ndarray:
    """One period of the reduction of every rank's pattern, in rank order (as the arithmetic
    of a reduction in rank order gives it): worked out once per job and shared by its ranks,
    not once per rank (n steps each).  Read-only: callers tile it into a new array."""
    acc = pattern(0, period, np.dtype(dtype), op)
    for k in range(1, n):
        ops.combine(op, acc, pattern(k, period, np.dtype(dtype), op))
    ops.finish(op, acc, n)
    acc.flags.writeable = False
    return acc


async def _once(
    comm: Communicator, coll: str, x: np.ndarray, inplace: bool, p: dict[str, Any]
) -> np.ndarray:
    out = x if inplace and coll in ("all_reduce", "broadcast", "all_to_all", "send_recv") else None
    if coll == "all_to_all":
        return await comm.all_to_all(x, out=out)
    if coll == "send_recv":
        n, r = comm.size, comm.rank
        into = out if out is not None else np.empty_like(x)
        return await comm.send_recv(x, (r + 1) % n, into, (r - 1) % n)
    if coll == "all_reduce":
        return await comm.all_reduce(x, p["op"], out=out, algo=p["algo"])
    if coll == "all_gather":
        return await comm.all_gather(x)
    if coll == "reduce_scatter":
        return await comm.reduce_scatter(x, p["op"])
    return await comm.broadcast(x, root=p["root"], out=out)


def _input(x: np.ndarray, inplace: bool, timing: bool) -> np.ndarray:
    """What an operation gets: ``x`` itself out of place (it is only read), a copy in place (a
    fresh buffer, timing only)."""
    if not inplace:
        return x
    return np.empty_like(x) if timing else x.copy()


@job("bench")
async def bench(comm: Communicator, p: dict[str, Any]) -> list[dict[str, Any]]:
    """params: coll, sizes (bytes), iters, warmup, check, op, dtype (nccl-tests name), root,
    algo.  Returns, per size, this rank's mean time (emulated s) and wrong elements, for
    out-of-place then in-place."""
    n, coll = comm.size, p["coll"]
    dtype = ops.DTYPES[p["dtype"]]
    rows = []
    for size in p["sizes"]:
        per_rank = size // dtype.itemsize // (n if coll in SPLIT else 1)
        row: dict[str, Any] = {"size": size, "count": size // dtype.itemsize}
        if coll == "all_to_all":  # whole elements per peer, as nccl-tests rounds
            row = {"size": per_rank * n * dtype.itemsize, "count": per_rank * n}
        for inplace in (False, True):
            total = per_rank * n if coll in ("reduce_scatter", "all_to_all") else per_rank
            # (reduce-scatter's n blocks of per_rank, block k at offset k x per_rank: one run)
            timing = comm.options.timing_only  # no value is read: none is made
            x = np.empty(total, dtype) if timing else pattern(comm.rank, total, dtype, p["op"])
            if coll == "all_reduce":  # links made on first use, made before the clock starts
                await comm.connect_for(x.nbytes, p["algo"])
            # a rank holds its input and one buffer: out of place the input is only read
            for _ in range(p["warmup"]):
                await _once(comm, coll, _input(x, inplace, timing), inplace, p)
            await comm.barrier()
            start = comm.ctx.now()
            result = x
            for _ in range(p["iters"]):
                result = await _once(comm, coll, _input(x, inplace, timing), inplace, p)
            elapsed = (comm.ctx.now() - start) / max(1, p["iters"])
            wrong: int | None = 0
            if comm.options.timing_only:
                wrong = None  # the fabric carried no values: nothing to check
            elif p["check"]:
                want = expected(coll, n, per_rank, dtype, p["op"], comm.rank, p["root"])
                wrong = int(np.count_nonzero(result.reshape(-1) != want))
            row["inplace" if inplace else "outofplace"] = {"time": elapsed, "wrong": wrong}
        rows.append(row)
    return rows


def table(
    coll: str, p: dict[str, Any], per_rank: dict[int, list[dict[str, Any]]]
) -> tuple[list[str], int]:
    """nccl-tests' table from every rank's rows; (lines, wrong elements in all)."""
    n = len(per_rank)
    factor = BUS_FACTOR[coll](n)
    redop = p["op"] if coll in ("all_reduce", "reduce_scatter") else "none"
    root = p["root"] if coll == "broadcast" else -1
    lines = [
        f"#{'out-of-place':>62}{'in-place':>35}",
        f"#{'size':>11}{'count':>14}{'type':>10}{'redop':>8}{'root':>8}"
        f"{'time':>9}{'algbw':>8}{'busbw':>8}{'#wrong':>7}{'time':>9}{'algbw':>8}{'busbw':>8}{'#wrong':>7}",
        f"#{'(B)':>11}{'(elements)':>14}{'':>26}{'(us)':>9}{'(GB/s)':>8}{'(GB/s)':>8}{'':>7}"
        f"{'(us)':>9}{'(GB/s)':>8}{'(GB/s)':>8}",
    ]
    wrong_total, busbws = 0, []
    rows = per_rank[0]
    checked = rows[0]["outofplace"]["wrong"] is not None if rows else True
    for k, row in enumerate(rows):
        cells = []
        for kind in ("outofplace", "inplace"):
            t = max(per_rank[r][k][kind]["time"] for r in per_rank)
            wrong = sum(per_rank[r][k][kind]["wrong"] or 0 for r in per_rank)
            wrong_total += wrong
            algbw = row["size"] / t / 1e9 if t > 0 else 0.0
            busbws.append(algbw * factor)
            shown = f"{wrong:7d}" if checked else f"{'N/A':>7}"  # as nccl-tests' -c 0
            cells.append(f"{t * 1e6:9.2f}{algbw:8.2f}{algbw * factor:8.2f}{shown}")
        lines.append(
            f"{row['size']:12d}{row['count']:14d}{p['dtype']:>10}{redop:>8}{root:8d}"
            + "".join(cells)
        )
    if checked:
        lines.append(
            f"# Out of bounds values : {wrong_total} {'OK' if wrong_total == 0 else 'FAILED'}"
        )
    else:
        lines.append(
            "# Out of bounds values : N/A (--payload none: timing only, values not checked)"
        )
    avg = sum(busbws) / len(busbws) if busbws else math.nan
    lines.append(f"# Avg bus bandwidth    : {avg:g} ")
    return lines, wrong_total


def fabric_summary(fab: dict[str, Any], upper: set[str] | None = None) -> list[str]:
    """The fabric's counters for the run; ``upper``: the switches above the leaves, whose
    bytes say how much of the run crossed the expensive tiers."""
    drops = sum(fab.get("drops", {}).values())
    senders = ", ".join(fab.get("pfc_senders", []))
    crossed = []
    if upper:
        sent = sum(v for k, v in fab.get("switch_tx_bytes", {}).items() if k in upper)
        crossed = [
            f"#   bytes through the tiers above the leaves ({', '.join(sorted(upper)[:3])}"
            f"{', ...' if len(upper) > 3 else ''}) {sent / 1e6:.2f} MB in this run"
        ]
    return [
        "#",
        "# Fabric (the interconnect tax):",
        f"#   PFC pause frames sent {fab.get('pfc_tx', 0)} (by {senders or 'nobody'}), "
        f"paused {fab.get('paused_seconds', 0.0) * 1e6:.1f} us in all",
        f"#   ECN marked {fab.get('ecn_marked', 0)}, CNPs sent {fab.get('cnps_sent', 0)}, "
        f"handled {fab.get('cnps_handled', 0)}",
        f"#   retransmitted packets {fab.get('retransmitted', 0)}, transport timeouts "
        f"{fab.get('timeouts', 0)}, drops {drops} {dict(fab.get('drops', {})) or ''}".rstrip(),
        f"#   late wake-ups {fab.get('late_wakeups', 0)}{lateness(fab)}, datagrams the kernel "
        f"dropped {fab.get('socket_drops', 0)}",
        *crossed,
    ]


def faithfulness_warning(fab: dict[str, Any], tdf: float) -> str | None:
    """The warning a run that fell behind must carry (what it measured is the machine's)."""
    late, dropped = fab.get("late_wakeups", 0), fab.get("socket_drops", 0)
    if not late and not dropped:
        return None
    return (
        f"# warning: the fabric fell behind at TDF {tdf:g} ({late} late wake-ups, {dropped} "
        "datagrams the kernel dropped during this run): it was not faithful; raise the TDF"
    )
