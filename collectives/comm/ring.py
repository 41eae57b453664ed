"""Ring schedules and what runs them, chunked and pipelined.

A schedule is a list of steps; in step s a rank sends one element range to its ring successor
and receives one from its predecessor, which it reduces into (``reduce``) or copies over its
own buffer.  Ranges are cut into chunks of at most one slot; chunk c of step s may leave only
after chunk c of the step it depends on has been received (the data it carries was reduced
there), so consecutive steps overlap chunk by chunk as in NCCL's ring.

The immediate of every write names the operation (its sequence number mod 256) and the item:
the write's place among the operation's writes on that link, which the sender counts in its
sends and the receiver in its receipts (the predecessor's step s sends what step s receives,
cut into the same chunks): ``seq << 24 | item``.  A receiver that sees anything but the item it
expects next fails the operation (the rings of two ranks disagree, or a stale write arrived).
An operation may have up to 2^24 writes on a link, whatever its steps (a ring of any length).
Slots are taken in a ring that runs on across operations: a rank may start the next operation
while its successor still drains this one.

An operation is driven by its links, not by tasks (:class:`Operation`): each arrival, credit,
completed write or failure calls its ``pump``, which reduces what arrived, grants the slots
back and writes the chunks now allowed, in the order a sender task and a receiver task woken
together would (sender, receiver, sender).  The caller's task waits once, for the end.  In
virtual and exact time that is no trio round per chunk (the engine runs the pump inside the
NIC's completion handler); the emulated result is the task version's, byte for byte.  The
pump runs for every chunk, so this module is compiled with the protocol cores (mypyc, where
the package is installed with a C compiler; ``pyproject.toml``'s ``compiled-cores``).

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
from collectives.comm.links import LinkError, Rx, Tx
from rocev2_emu.verbs import MR

MAX_ITEMS: Final = 1 << 24  # writes of one operation on one link (the immediate's low bits)


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


def imm_of(seq: int, item: int) -> int:
    """The immediate of write ``item`` (its place among the operation's writes on the link)."""
    return (seq & 0xFF) << 24 | item


_WAIT_NONE: Final = 0  # (what an operation waits for, :meth:`Operation.render`)
_WAIT_SENDING: Final = 1  # its NIC to finish sending
_WAIT_CHUNK: Final = 2  # a chunk from its predecessor
_WAIT_CREDIT: Final = 3  # a credit from its successor


class Operation:
    """One ring operation driven by its links: :meth:`pump` runs whenever either link changes
    (an arrival, a credit, a write completed, a failure), from the NIC driver's completion
    handler or the server fabric's delivery, and does at once what the change allows - reduce
    or copy what arrived, grant its slot back, write the chunks whose data and credit are
    there.  No trio task runs per chunk: in virtual and exact time an operation costs the
    engine no trio round until it ends."""

    def __init__(
        self,
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
        compute: bool = True,
    ) -> None:
        """``steps`` on ``work`` (registered as ``mr`` for RDMA sends); ``progress`` holds one
        string saying what is awaited, for the caller's timeout message; ``compute=False`` (a
        timing-only run): what arrives is neither reduced nor copied - the writes, credits and
        their order are the same, the values are not."""
        slot_bytes = (tx or rx).slot_bytes if (tx or rx) else 1 << 20  # type: ignore[union-attr]
        chunk = max(1, slot_bytes // work.itemsize)
        self.work, self.mr, self.tx, self.rx = work, mr, tx, rx
        self.raw = work.view(np.uint8)
        self.op, self.seq, self.progress, self.pred, self.succ = op, seq, progress, pred, succ
        self.compute = compute
        # what this rank sends, in order: (step, chunk, lo, hi, the step it waits on)
        self.sends: list[tuple[int, int, int, int, int | None]] = []
        # what it receives, in order: (step, chunk, lo, hi, reduce)
        self.recvs: list[tuple[int, int, int, int, bool]] = []
        self.done: list[list[bool]] = []
        for s, step in enumerate(steps):
            if step.send is not None and tx is not None:
                pieces = _chunks(step.send, chunk)
                self.sends += [(s, c, lo, hi, step.after) for c, (lo, hi) in enumerate(pieces)]
            pieces = _chunks(step.recv, chunk) if step.recv is not None and rx is not None else []
            self.recvs += [(s, c, lo, hi, step.reduce) for c, (lo, hi) in enumerate(pieces)]
            self.done.append([False] * len(pieces))
        if max(len(self.sends), len(self.recvs)) > MAX_ITEMS:
            raise ValueError(
                f"{max(len(self.sends), len(self.recvs))} writes on one link > {MAX_ITEMS}: "
                "larger slots (slot_bytes) or a shorter ring"
            )
        self.sent = 0  # sends posted
        self.received = 0  # receipts reduced or copied
        self.error: BaseException | None = None
        self.over = False  # ended: done, or failed (``error``)
        self.ended: Ending | None = None  # told when it ends (its run's, or :func:`run_all`'s)
        self._busy = False  # in pump: a change made by pump itself (a free fabric) loops
        self._again = False
        self._woke = False  # a link said trio must run (a server fabric's new deadline)
        # what it last waited for (rendered into ``progress`` when its run ends, by
        # :meth:`render`, not at each wait): one of the _WAIT_* kinds, and a step and chunk
        self._wait = _WAIT_NONE
        self._wait_step = self._wait_chunk = 0

    async def run(self) -> None:
        """Until every chunk is sent, received and its write complete, driven by the links'
        changes; raises what failed the operation."""
        await run_all([self])

    def _listen(self, ended: Ending) -> None:
        self.ended = ended
        for link in (self.tx, self.rx):
            if link is None:
                continue
            if link.listener is not None:
                raise RuntimeError(f"a link to {self.pred}/{self.succ} already runs an operation")
            link.listener = self.pump

    def _unlisten(self) -> None:
        for link in (self.tx, self.rx):
            if link is not None and link.listener == self.pump:
                link.listener = None

    def render(self) -> None:
        """Write what it last waited for into ``progress`` (for a passed deadline's message)."""
        if self._wait == _WAIT_SENDING:
            self.progress[0] = f"the NIC to finish sending to {self.succ}"
        elif self._wait == _WAIT_CHUNK:
            self.progress[0] = f"step {self._wait_step} chunk {self._wait_chunk} from {self.pred}"
        elif self._wait == _WAIT_CREDIT:
            self.progress[0] = f"a credit from {self.succ}"

    def _end(self, error: BaseException | None = None) -> None:
        self.over, self.error = True, error
        if self.ended is not None:
            self.ended.one(error)

    def pump(self) -> bool:
        """Do what the links allow now; True if trio must run before time moves on: the
        operation ended (its task woke), or a link said so (:meth:`ServerFabric.send`)."""
        if self._busy:
            self._again = True
            return False
        if self.over:
            return False
        self._busy = True
        self._woke = False
        try:
            # as the tasks of a sender and a receiver woken together ran: the sender first (it
            # was created first), then the receiver, then the sender on what it received
            self._send()
            while True:
                self._again = False
                if not self._receive() and not self._again:
                    break
                self._send()
            if self.received == len(self.recvs) and self.sent == len(self.sends):
                if self.tx is None or not self.tx.outstanding:
                    self._end()
                    return True
                self._wait = _WAIT_SENDING
            for link in (self.tx, self.rx):
                if link is not None and link.error:
                    raise LinkError(link.error)
        except Exception as exc:  # raised by the waiting task, not in the driver
            self._end(exc)
            return True
        finally:
            self._busy = False
        return self._woke

    def _receive(self) -> bool:
        """Reduce or copy what arrived, granting each slot back; True if anything did."""
        rx, recvs, work = self.rx, self.recvs, self.work
        start = self.received
        while self.received < len(recvs):
            s, c, lo, hi, reduce = recvs[self.received]
            assert rx is not None
            got = rx.take()
            if got is None:
                self._wait, self._wait_step, self._wait_chunk = _WAIT_CHUNK, s, c
                break
            imm, nbytes, slot = got
            want = imm_of(self.seq, self.received)
            if imm != want or nbytes != (hi - lo) * work.itemsize:
                raise ProtocolError(
                    f"expected step {s} chunk {c} ({(hi - lo) * work.itemsize} B, immediate "
                    f"{want:#x}), got immediate {imm:#x} with {nbytes} B"
                )
            if self.compute:
                incoming = rx.slot(slot, nbytes).view(work.dtype)
                if reduce:
                    ops.combine(self.op, work[lo:hi], incoming)
                else:
                    work[lo:hi] = incoming
            self.received += 1
            self.done[s][c] = True
            if rx.release(slot):
                self._woke = True
        return self.received > start

    def _send(self) -> None:
        tx, sends, itemsize = self.tx, self.sends, self.work.itemsize
        while self.sent < len(sends):
            s, c, lo, hi, after = sends[self.sent]
            assert tx is not None
            if after is not None and not self.done[after][c]:
                if self.received == len(self.recvs):  # no receipt is left to bring it
                    raise ProtocolError(f"step {s} chunk {c} waits on step {after}, never run")
                self._wait, self._wait_step, self._wait_chunk = _WAIT_CHUNK, after, c
                return
            slot = tx.take_credit()
            if slot is None:
                self._wait = _WAIT_CREDIT
                return
            b0, b1 = lo * itemsize, hi * itemsize
            imm = imm_of(self.seq, self.sent)
            self.sent += 1
            if tx.write(slot, self.raw[b0:b1], self.mr, b0, imm):
                self._woke = True


class Ending:
    """What the one task running a set of operations waits for: all of them ended, or the
    first failure.  One per :func:`run_all`, whatever the number of operations."""

    def __init__(self, count: int) -> None:
        self.left = count
        self.error: BaseException | None = None
        self.event = trio.Event()
        if not count:
            self.event.set()

    def one(self, error: BaseException | None) -> None:
        self.left -= 1
        if error is not None and self.error is None:
            self.error = error
        if self.left == 0 or error is not None:
            self.event.set()


async def run_all(operations: list[Operation]) -> None:
    """``operations``, each on links of its own, until every one has ended - one waiting task
    for them all, however many (an all-to-all's pairs); each starts with a pump, in list
    order.  The first failure ends the wait and is raised; the others stop listening to
    their links, as cancelled tasks would."""
    ended = Ending(len(operations))
    try:
        for operation in operations:
            operation._listen(ended)
        for operation in operations:
            operation.pump()
        await ended.event.wait()  # (a checkpoint even when all ended in their first pump)
    finally:  # (cancelled by a passed deadline too: its message reads the progress)
        for operation in operations:
            operation.render()
            operation._unlisten()
    if ended.error is not None:
        raise ended.error


def first_error(group: BaseExceptionGroup[BaseException]) -> BaseException:
    """The first exception in a (nested) group that is not a cancellation."""
    for exc in group.exceptions:
        if isinstance(exc, BaseExceptionGroup):
            return first_error(exc)
        if not isinstance(exc, trio.Cancelled):
            return exc
    return group
