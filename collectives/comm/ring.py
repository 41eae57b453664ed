"""Ring schedules and the engine that runs them, chunked and pipelined.

A schedule is a list of steps; in step s a rank sends one element range to its ring successor
and receives one from its predecessor, which it reduces into (``reduce``) or copies over its
own buffer.  Ranges are cut into chunks of at most one slot; chunk c of step s may leave only
after chunk c of the step it depends on has been received (the data it carries was reduced
there), so consecutive steps overlap chunk by chunk as in NCCL's ring.

The immediate of every write names the operation (its sequence number mod 256), the step and
the chunk: ``seq << 24 | step << 16 | chunk``; a receiver that sees anything but the item it
expects next fails the operation (the rings of two ranks disagree, or a stale write arrived).
Slots are taken in a ring that runs on across operations: a rank may start the next operation
while its successor still drains this one.

Schedules (``n`` ranks, ring position ``r``, segments as :func:`segments` cuts them):

* reduce-scatter, leaving segment ``r`` reduced at position ``r``: step s sends segment
  ``r - s - 1`` and receives ``r - s - 2`` (mod n), for s = 0 .. n-2;
* all-gather from segment ``r`` at position ``r``: step s sends ``r - s`` and receives
  ``r - s - 1``;
* all-reduce: the two in a row (2 (n - 1) steps);
* broadcast from position 0: one step in which everyone but the last forwards what it received
  (the root only sends).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Final

import numpy as np
import trio

from collectives.comm import ops
from collectives.comm.links import Rx, Tx
from rocev2_emu.verbs import MR

MAX_STEPS: Final = 255
MAX_CHUNKS: Final = 0xFFFF


class ProtocolError(Exception):
    """A write arrived that the schedule did not expect."""


@dataclass(slots=True, frozen=True)
class Step:
    send: tuple[int, int] | None  # element range sent to the successor
    recv: tuple[int, int] | None  # element range received from the predecessor
    reduce: bool  # combine what arrives (else copy it)
    after: int | None  # the step whose receipt of the same chunk a send waits for


def segments(count: int, parts: int) -> list[tuple[int, int]]:
    """``count`` elements in ``parts`` contiguous ranges whose sizes differ by at most one."""
    base, extra = divmod(count, parts)
    bounds = [0]
    for i in range(parts):
        bounds.append(bounds[-1] + base + (1 if i < extra else 0))
    return list(itertools.pairwise(bounds))


def reduce_scatter_steps(segs: list[tuple[int, int]], r: int) -> list[Step]:
    n = len(segs)
    return [
        Step(segs[(r - s - 1) % n], segs[(r - s - 2) % n], True, s - 1 if s else None)
        for s in range(n - 1)
    ]


def all_gather_steps(segs: list[tuple[int, int]], r: int, first: int = 0) -> list[Step]:
    """``first`` is the index the first step gets: the step before it (if any) received what
    step 0 sends."""
    n = len(segs)
    return [
        Step(segs[(r - s) % n], segs[(r - s - 1) % n], False, first + s - 1 if first + s else None)
        for s in range(n - 1)
    ]


def all_reduce_steps(segs: list[tuple[int, int]], r: int) -> list[Step]:
    return reduce_scatter_steps(segs, r) + all_gather_steps(segs, r, first=len(segs) - 1)


def broadcast_steps(count: int, r: int, n: int) -> list[Step]:
    whole = (0, count)
    if r == 0:
        return [Step(whole, None, False, None)]
    return [Step(whole if r < n - 1 else None, whole, False, 0)]


def _chunks(rng: tuple[int, int], chunk: int) -> list[tuple[int, int]]:
    lo, hi = rng
    return [(a, min(hi, a + chunk)) for a in range(lo, hi, chunk)]


def imm_of(seq: int, step: int, chunk: int) -> int:
    return (seq & 0xFF) << 24 | step << 16 | chunk


async def run(
    steps: list[Step],
    work: np.ndarray,
    mr: MR | None,
    tx: Tx | None,
    rx: Rx | None,
    *,
    op: str,
    seq: int,
    progress: list[str],
    pred: str = "the predecessor",
    succ: str = "the successor",
) -> None:
    """Run ``steps`` on ``work`` (registered as ``mr`` for RDMA sends).  ``progress`` holds one
    string saying what is awaited, for the caller's timeout message."""
    if len(steps) > MAX_STEPS:
        raise ValueError(f"{len(steps)} ring steps > {MAX_STEPS}: too many ranks in one ring")
    slot_bytes = (tx or rx).slot_bytes if (tx or rx) else 1 << 20  # type: ignore[union-attr]
    chunk = max(1, slot_bytes // work.itemsize)
    done = [[False] * len(_chunks(s.recv, chunk)) if s.recv else [] for s in steps]
    received = trio.lowlevel.ParkingLot()
    raw = work.view(np.uint8)

    async def sender() -> None:
        assert tx is not None
        for s, step in enumerate(steps):
            if step.send is None:
                continue
            pieces = _chunks(step.send, chunk)
            if len(pieces) > MAX_CHUNKS:
                raise ValueError(f"{len(pieces)} chunks in one step > {MAX_CHUNKS}")
            for c, (lo, hi) in enumerate(pieces):
                if step.after is not None:
                    while not done[step.after][c]:
                        progress[0] = f"step {step.after} chunk {c} from {pred}"
                        await received.park()
                progress[0] = f"a credit from {succ}"
                slot = await tx.acquire()
                b0, b1 = lo * work.itemsize, hi * work.itemsize
                tx.write(slot, raw[b0:b1], mr, b0, imm_of(seq, s, c))
        progress[0] = f"the NIC to finish sending to {succ}"
        await tx.drain()

    async def receiver() -> None:
        assert rx is not None
        for s, step in enumerate(steps):
            if step.recv is None:
                continue
            for c, (lo, hi) in enumerate(_chunks(step.recv, chunk)):
                progress[0] = f"step {s} chunk {c} from {pred}"
                imm, nbytes, slot = await rx.arrival()
                want = imm_of(seq, s, c)
                if imm != want or nbytes != (hi - lo) * work.itemsize:
                    raise ProtocolError(
                        f"expected step {s} chunk {c} ({(hi - lo) * work.itemsize} B, immediate "
                        f"{want:#x}), got immediate {imm:#x} with {nbytes} B"
                    )
                incoming = rx.slot(slot, nbytes).view(work.dtype)
                if step.reduce:
                    ops.combine(op, work[lo:hi], incoming)
                else:
                    work[lo:hi] = incoming
                rx.release(slot)
                done[s][c] = True
                received.unpark_all()

    try:
        async with trio.open_nursery() as nursery:
            if tx is not None and any(s.send for s in steps):
                nursery.start_soon(sender)
            if rx is not None and any(s.recv for s in steps):
                nursery.start_soon(receiver)
    except BaseExceptionGroup as group:
        raise first_error(group) from None


def first_error(group: BaseExceptionGroup[BaseException]) -> BaseException:
    """The first exception in a (nested) group that is not a cancellation."""
    for exc in group.exceptions:
        if isinstance(exc, BaseExceptionGroup):
            return first_error(exc)
        if not isinstance(exc, trio.Cancelled):
            return exc
    return group
