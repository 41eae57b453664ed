"""Who waits on a NIC core's queues, and waking them after the core ran (compiled with the
cores: the event engine calls :meth:`Waiters.wake` after every service of a NIC that made
completions, so a collective's chunk passes no interpreted frame between the heap and its
completion handler).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rocev2_emu.nic.core import NicCore


class Waiters:
    """The completion handlers and parked tasks of one NIC core: ``handlers`` by CQ handle
    (:meth:`set_handler`), ``lots`` the trio parking lots of tasks waiting on a CQ,
    ``rx_lot`` the one of tasks waiting for datagrams; ``sync`` runs before the handlers when
    one of them reads the clock (the engine bringing trio's clock to the instant).  Grows with
    the CQs that have a handler or a waiting task."""

    def __init__(self, core: NicCore, rx_lot: Any, sync: Callable[[], None] | None) -> None:
        self.core = core
        self.handlers: dict[int, Callable[[], bool]] = {}
        self.clocked: set[int] = set()  # the CQs whose handler reads the clock
        self.lots: dict[int, Any] = {}  # trio.lowlevel.ParkingLot by CQ handle
        self.rx_lot = rx_lot
        self.sync = sync

    def set_handler(
        self, handle: int, handler: Callable[[], bool] | None, reads_clock: bool = True
    ) -> None:
        """``handler`` runs when CQ ``handle`` grows (None: no longer); ``reads_clock``: it
        may read the emulated clock, which ``sync`` then brings to the instant first."""
        self.clocked.discard(handle)
        if handler is None:
            self.handlers.pop(handle, None)
            return
        self.handlers[handle] = handler
        if reads_clock:
            self.clocked.add(handle)

    def wake(self, received: int) -> bool:
        """After the core ran: run the handlers of the queues that grew and wake whoever waits
        on them, or for datagrams (``received`` since the last time); True if a task woke."""
        core = self.core
        woke = False
        grown = core.grown_cqs
        if grown:
            handlers, lots = self.handlers, self.lots
            if self.clocked and self.sync is not None:
                self.sync()
            handles = list(grown)
            grown.clear()  # a handler's post may grow a queue again (a flushed QP)
            for handle in handles:
                handler = handlers.get(handle)
                if handler is not None and handler():
                    woke = True
                lot = lots.get(handle)
                if lot is not None and lot.unpark_all():
                    woke = True
        if received and core.receive_waiters and self.rx_lot.unpark_all():
            woke = True
        return woke
