"""The intra-server fabric as a sans-IO model: a non-blocking crossbar whose ports are the
server's accelerators, each with ``bandwidth`` bytes per second out and as much in, and a fixed
``latency`` from the last byte sent to its delivery.

This is the shape of an NVSwitch-based server (every GPU's NVLinks go to the NVSwitch chips, so
any GPU reaches any other at its full per-GPU bandwidth, and what limits a transfer is the
sender's and the receiver's ports) and, with PCIe-class figures, of accelerators behind a PCIe
switch.  Transfers are fluid, not packets: the transfers in progress share each port max-min
fairly (progressive filling: the port with the smallest fair share fixes its transfers' rate
first), and the rates change only when a transfer starts or ends.  An S-byte transfer alone
takes ``S / bandwidth + latency``; two from one accelerator, or two into one, take twice as long
each; two between different pairs do not slow each other.  Transfers from one accelerator to
another are served in order, one at a time (a copy engine's queue): the first written is the
first delivered.  A zero-byte transfer (a flag or credit) costs ``latency``.

Sources of the presets: NVLink 4 (H100 SXM5: 900 GB/s per GPU both ways, so 450 GB/s = 3 600
Gb/s each way, NVIDIA's H100 datasheet), a latency of 0.5 us (NCCL's tuning model charges 0.47
us per ring step over NVLink with its LL protocol, ``hwLat`` in src/graph/tuning.cc); PCIe 5.0
x16 (32 GT/s x 16 lanes, 128b/130b: 63 GB/s, taken as 504 Gb/s each way, PCI-SIG), latency 1 us
(an assumption, the order of a PCIe switch round trip).  ``free``: copies take no time (the
model before this one, to compare against).
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final


@dataclass(frozen=True, slots=True)
class IntraServerConfig:
    """One server's fabric: what it is, its per-accelerator bandwidth each way (bits per
    second; 0: copies take no time) and its latency (seconds)."""

    kind: str
    bandwidth_bps: float
    latency: float

    @property
    def free(self) -> bool:
        return self.bandwidth_bps == 0

    def modelled(self, ports: int) -> bool:
        """Whether a server of ``ports`` accelerators on this fabric runs a model (and counts
        its traffic): not on a free fabric, nor with one accelerator."""
        return not self.free and ports >= 2

    def describe(self) -> str:
        if self.free:
            return "free (copies take no emulated time)"
        return (
            f"{self.kind}, {self.bandwidth_bps / 1e9:g} Gb/s per accelerator each way, "
            f"{self.latency * 1e6:g} us"
        )


DEFAULT_PRESET: Final = "nvlink"  # a server's fabric when its topology names none

PRESETS: Final = {
    "nvlink": IntraServerConfig("nvlink", 3600e9, 0.5e-6),
    "pcie": IntraServerConfig("pcie", 504e9, 1e-6),
    "free": IntraServerConfig("free", 0.0, 0.0),
}


class _Transfer:
    __slots__ = ("dst", "fixed", "on_delivered", "rate", "remaining", "size", "src")

    def __init__(self, src: int, dst: int, size: int, on_delivered: Callable[[], object]) -> None:
        self.src = src
        self.dst = dst
        self.size = size
        self.remaining = float(size)
        self.rate = 0.0
        self.fixed = False  # its rate is set in the share being worked out
        self.on_delivered = on_delivered


class _Resource:
    """One direction of one port in :meth:`Crossbar._share`: its number (which orders ties),
    its capacity left, its transfers not yet fixed and the transfers using it (native fields:
    nothing boxed as the share is worked out)."""

    __slots__ = ("left", "number", "unfixed", "users")

    def __init__(self, number: int) -> None:
        self.number = number
        self.left = 0.0
        self.unfixed = 0
        self.users: list[_Transfer] = []


class Crossbar:
    """``ports`` accelerators, ``bandwidth`` bytes/s each way per port, ``latency`` seconds.

    :meth:`send` queues a transfer at ``now``; :meth:`next_time` is the earliest instant
    anything changes (a transfer's last byte leaves, or one is delivered); :meth:`advance` moves
    the model to ``now`` and returns the delivery callbacks due, in delivery order.  Holds its
    transfers on their way, a queue per busy pair of ports, and a few numbers per port (the
    fair share's work space among them: nothing is allocated to work a share out)."""

    def __init__(self, ports: int, bandwidth: float, latency: float) -> None:
        if ports < 1 or not bandwidth > 0 or latency < 0:
            raise ValueError(f"crossbar of {ports} ports, {bandwidth} B/s, {latency} s")
        self.ports = ports
        self.bandwidth = bandwidth
        self.latency = latency
        self.at = 0.0  # the model's time
        self._queues: dict[int, deque[_Transfer]] = {}  # by src * ports + dst
        self._active: list[_Transfer] = []  # the head of each busy pair, in start order
        self._landing: list[tuple[float, int, _Transfer]] = []  # (delivery time, seq, transfer)
        self._seq = 0
        self.tx_bytes = [0] * ports  # bytes whose last byte left, per sending port
        self.rx_bytes = [0] * ports  # bytes delivered, per receiving port
        self.tx_busy = [0.0] * ports  # seconds a port was sending something
        self.rx_busy = [0.0] * ports
        self.transfers = 0  # delivered
        # the share's work space (:meth:`_share`): each resource, and the resources in use
        self._resources = [_Resource(number) for number in range(2 * ports)]
        self._used: list[_Resource] = []
        self._marks = [False] * (2 * ports)  # a port's direction counted busy (:meth:`_run_for`)
        self._ending = False  # in :meth:`_progress`, ending transfers (their pairs' next start)

    def send(
        self, src: int, dst: int, size: int, now: float, on_delivered: Callable[[], object]
    ) -> None:
        ports = self.ports
        if not (0 <= src < ports and 0 <= dst < ports) or src == dst:
            raise ValueError(f"a transfer from port {src} to port {dst} of {ports}")
        self._progress(now)
        transfer = _Transfer(src, dst, size, on_delivered)
        key = src * ports + dst
        queue = self._queues.get(key)
        if queue is None:
            queue = self._queues[key] = deque()
        queue.append(transfer)
        if len(queue) == 1:
            self._start(transfer)

    def next_time(self) -> float | None:
        best: float | None = None
        for t in self._active:
            f = self._finish_time(t)
            if best is None or f < best:
                best = f
        if self._landing:
            f = self._landing[0][0]
            if best is None or f < best:
                best = f
        return best

    def advance(self, now: float) -> list[Callable[[], object]]:
        self._progress(now)
        due: list[Callable[[], object]] = []
        while self._landing and self._landing[0][0] <= now:
            _, _, transfer = heapq.heappop(self._landing)
            self.rx_bytes[transfer.dst] += transfer.size
            self.transfers += 1
            due.append(transfer.on_delivered)
        return due

    # -- the fluid model ------------------------------------------------------------------
    def _finish_time(self, t: _Transfer) -> float:
        return self.at + (t.remaining / t.rate if t.rate > 0 else 0.0)

    def _start(self, transfer: _Transfer) -> None:
        if transfer.size == 0:  # a flag: nothing to send, only the latency
            self._sent(transfer)
            return
        self._active.append(transfer)
        if not self._ending:  # (transfers ending: :meth:`_progress` shares once after them)
            self._share()

    def _sent(self, transfer: _Transfer) -> None:
        """The last byte left: delivery after the latency; the pair's next transfer starts."""
        self.tx_bytes[transfer.src] += transfer.size
        self._seq += 1
        heapq.heappush(self._landing, (self.at + self.latency, self._seq, transfer))
        key = transfer.src * self.ports + transfer.dst
        queue = self._queues[key]
        queue.popleft()
        if queue:
            self._start(queue[0])
        else:
            del self._queues[key]

    def _progress(self, now: float) -> None:
        """Run the transfers forward to ``now``, ending each whose last byte leaves on the way
        (the rates change at each end)."""
        while self._active:
            first = self._active[0]  # the first of the earliest to finish
            end = self._finish_time(first)
            for t in self._active:
                f = self._finish_time(t)
                if f < end:
                    first, end = t, f
            if end > now:
                break
            self._run_for(end - self.at)
            done: list[_Transfer] = []
            going: list[_Transfer] = []
            for t in self._active:
                (done if t is first or t.remaining <= t.rate * 1e-12 else going).append(t)
            self._active = going
            self._ending = True
            try:
                for t in done:
                    t.remaining = 0.0
                    self._sent(t)
            finally:
                self._ending = False
            self._share()
        if now > self.at:
            self._run_for(now - self.at)

    def _run_for(self, dt: float) -> None:
        if dt <= 0:
            return
        ports = self.ports
        marks = self._marks
        for t in self._active:
            t.remaining = max(0.0, t.remaining - t.rate * dt)
            if not marks[ports + t.src]:
                marks[ports + t.src] = True
                self.tx_busy[t.src] += dt
            if not marks[t.dst]:
                marks[t.dst] = True
                self.rx_busy[t.dst] += dt
        for t in self._active:
            marks[ports + t.src] = marks[t.dst] = False
        self.at += dt

    def _share(self) -> None:
        """Max-min fair rates by progressive filling over the ports' two directions.

        A resource is a port's direction, numbered ``port`` for its receive side and ``ports +
        port`` for its send side (so the number orders ties as ("rx", port) < ("tx", port)).
        Each step fixes the resource with the smallest fair share, ties to the lower number; its
        unfixed transfers take that share, and each takes it off both its resources.  Costs
        O(resources) a step and at most ``2 ports`` steps."""
        active = self._active
        if not active:
            return
        ports = self.ports
        resources = self._resources
        used = self._used
        used.clear()
        for t in active:
            t.fixed = False
            self._use(resources[ports + t.src], t)
            self._use(resources[t.dst], t)
        busy = len(used)  # resources with a transfer still without a rate
        while busy:
            best = -1
            best_res = used[0]
            share = 0.0
            for res in used:
                n = res.unfixed
                if n:
                    s = res.left / n
                    r = res.number
                    if best < 0 or s < share or (s == share and r < best):
                        best, best_res, share = r, res, s
            for t in best_res.users:
                if not t.fixed:
                    t.rate = share
                    t.fixed = True
                    busy -= _take(resources[ports + t.src], share) + _take(resources[t.dst], share)

    def _use(self, res: _Resource, t: _Transfer) -> None:
        """``t`` uses resource ``res`` (:meth:`_share`'s set-up)."""
        if not res.unfixed:
            self._used.append(res)
            res.users.clear()
        res.left = self.bandwidth
        res.users.append(t)
        res.unfixed += 1


def _take(res: _Resource, share: float) -> int:
    """A transfer of ``res`` is fixed at ``share``; 1 if it was the last of ``res``."""
    res.left -= share
    res.unfixed -= 1
    return 0 if res.unfixed else 1
