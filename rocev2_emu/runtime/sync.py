"""Conservative synchronisation of an emulation split over processes: the model, the wire
format of a frame between processes, and the clock hold of out-of-band waits.  The rooms of
the rest: :mod:`~rocev2_emu.runtime.sync_messages` (hello, report, grant, stop, link change,
typed), :mod:`~rocev2_emu.runtime.rounds` (the coordinator's decisions, sans-IO),
:mod:`~rocev2_emu.runtime.coordinator` (its trio shell), :mod:`~rocev2_emu.runtime.sync_link`
(a sync connection's framing) and :mod:`~rocev2_emu.runtime.exact` (a node process's engine).

The model is ns-3's distributed simulator (``DistributedSimulatorImpl``: every rank reports
the time of its next event, an all-reduce takes the global minimum, and each rank runs the
events of the granted window) with SST's per-window message accounting, on this project's own
engine (:mod:`rocev2_emu.runtime.events`).  A *round*:

1. every process runs the events of its window - those strictly before ``until`` - sending the
   frames its cores put on links to other processes as UDP datagrams, then *reports*: the time
   of its next event (its heap's, its application tasks' next trio deadline, or "now" while an
   out-of-band wait holds its clock), the earliest arrival time of the frames it sent in the
   window, and how many frames it has sent to each other process since the start;
2. once every process has reported, the coordinator grants the next window to all:
   ``until = min(everything reported) + lookahead``, where the lookahead is the smallest delay
   of a link between processes, and tells each process how many frames it must have received
   from each other process before it runs it (what that one has sent it so far): counted per
   sender, because the datagrams of one sender reach a receiver in the order they were sent,
   but a frame sent in the last window may still be on its way (a bridge, a busy kernel)
   when another process's frame of the next one arrives.

Why that is exact: a frame sent at ``t >= min`` arrives at ``t + delay >= until``, so nothing
can still arrive inside a granted window once its frames are all in; the events of one node run
in the key order of :mod:`rocev2_emu.runtime.events`, which no split changes.  Idle stretches
cost one round (the minimum jumps to the next event, wherever it is).  A round that could not
move ``until`` (a process holds its clock at ``now`` for an out-of-band wait) is not granted:
the coordinator waits for a report that changes it - or, from a process that is not held and has
work before the end of the window it holds (woken while it waited: a report is a promise, so it
ran nothing), grants that window again to it alone.  A process whose application decides in wall
time (a torch rank between collectives) reports ``busy`` as well as held: no stall is declared
while one is; ``done`` says its application has finished (:meth:`Coordinator.apps_done`).

**The wire**: a frame between processes is the VXLAN datagram of the process mode, unchanged,
followed by a 16-byte trailer - its arrival time (IEEE 754 double, emulated seconds, the exact
value the sender's heap computed) and the link's sequence number (unsigned 64-bit) - both in
network byte order.  A trailer and not a header: everything from the VXLAN header to the ICRC
stays where Wireshark expects it (the trailer shows as the Ethernet frame's trailer), and the
frame's own bytes are what the virtual run carries.  The receiver checks that each link's
sequence numbers come in order with no gap; a gap, a datagram from the wrong sender, or a
malformed one stops the run naming the link (no silently different result).

**Changes to the fabric** happen at emulated instants, never at a wall-clock moment: a process
asks for one (:class:`LinkChange`: links between named nodes down or up at time ``at``) with its
report; the coordinator refuses one whose instant a granted window has already passed, bounds
the next window at ``at + lookahead`` and hands the change to every process with that window's
grant.  Each process applies it when its engine reaches ``at`` (a switch: its ports on those
links, and routes converged around every link down), so the change is one event of the run,
seen everywhere at the same instant.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Final, Protocol

import trio

TRAILER: Final = struct.Struct("!dQ")  # arrival time (emulated s), the link's sequence number


# where a node process finds the coordinator: (host, port), or the path of its Unix socket
# (a local run's: cheaper per message than loopback TCP)
SyncAddress = tuple[str, int] | str


def sync_label(address: SyncAddress) -> str:
    """``address`` as ``node --sync`` takes it and messages name it: HOST:PORT or the path."""
    return address if isinstance(address, str) else f"{address[0]}:{address[1]}"


def with_trailer(datagram: bytes, at: float, seq: int) -> bytes:
    return datagram + TRAILER.pack(at, seq)


def split_trailer(datagram: bytes | memoryview) -> tuple[bytes, float, int]:
    """(the datagram, its arrival time, its sequence number); ValueError if too short."""
    n = len(datagram) - TRAILER.size
    if n <= 0:
        raise ValueError(f"a {len(datagram)}-byte datagram has no room for the sync trailer")
    at, seq = TRAILER.unpack_from(datagram, n)
    if not math.isfinite(at) or at < 0:
        raise ValueError(f"arrival time {at!r} in the sync trailer")
    return bytes(datagram[:n]), at, seq


# -- the clock hold of out-of-band waits ---------------------------------------------------


class Holdable(Protocol):
    """What holds its clock during out-of-band waits (the exact engine)."""

    def hold(self) -> None: ...

    def release(self) -> None: ...


_HOLDER: trio.lowlevel.RunVar[Holdable | None] = trio.lowlevel.RunVar("exact_holder", None)


def set_holder(holder: Holdable | None) -> None:
    """This trio run's engine, whose clock out-of-band waits hold (None: no synchronised
    engine here; holds are no-ops)."""
    _HOLDER.set(holder)


@contextmanager
def holding_clock() -> Iterator[None]:
    """Around an out-of-band wait (a control request, the rendezvous store): while it lasts,
    this process's emulated clock does not move past now, so whatever the answer's wall-clock
    arrival, it is seen at the same emulated instant.  A no-op outside an exact run."""
    try:
        holder = _HOLDER.get()
    except RuntimeError:  # not inside trio.run
        holder = None
    if holder is None:
        yield
        return
    holder.hold()
    try:
        yield
    finally:
        holder.release()


# Between windows a node process waits for its grant in the kernel, trio standing still, when
# nothing else can happen in it meanwhile (rocev2_emu.runtime.exact.ExactEngine._barrier) - at
# most BLOCK_SECONDS at a time, and only if trio has run its tasks within TRIO_EVERY (control
# requests and threads' calls are served at least that often); otherwise, or if no grant came,
# it waits in trio.
TRIO_EVERY: Final = 0.02  # wall seconds
BLOCK_SECONDS: Final = 0.01  # wall seconds
