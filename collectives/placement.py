"""Where a job's ranks are and how they are connected: each rank's place (host, leaf, local
rank), the ranks of one host (shared memory and a barrier), the rings and their ends, the ring
order, and a communicator's options.

The ring order is leaf-major, then host-major, then by local rank (``order="topology"``), so a
ring crosses each spine link as few times as it can; ``order="rank"`` keeps rank order (the
naive ring).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import trio

from collectives.links import LocalRx, Rx, Tx


@dataclass(slots=True, frozen=True)
class RankPlace:
    """Where a rank runs: its host, the host's leaf switch, its index on the host."""

    rank: int
    host: str
    leaf: str
    local_rank: int


@dataclass(slots=True)
class HostGroup:
    """The ranks of one host: shared memory between them, and a barrier."""

    size: int
    buffers: dict[int, np.ndarray] = field(default_factory=dict)  # local rank -> its shard
    links: dict[tuple[int, int, str], LocalRx] = field(default_factory=dict)
    _arrived: int = 0
    _generation: int = 0
    _lot: trio.lowlevel.ParkingLot = field(default_factory=trio.lowlevel.ParkingLot)

    def local_link(
        self, src: int, dst: int, ring_name: str, slots: int, slot_bytes: int
    ) -> LocalRx:
        key = (src, dst, ring_name)
        if key not in self.links:
            self.links[key] = LocalRx(slots, slot_bytes)
        return self.links[key]

    async def barrier(self) -> None:
        generation = self._generation
        self._arrived += 1
        if self._arrived == self.size:
            self._arrived = 0
            self._generation += 1
            self._lot.unpark_all()
            return
        while self._generation == generation:
            await self._lot.park()


@dataclass(slots=True)
class Ring:
    name: str
    members: list[int]  # global ranks in ring order
    pos: int
    tx: Tx | None
    rx: Rx | None


def ring_order(places: list[RankPlace], order: str) -> list[int]:
    if order == "rank":
        return [p.rank for p in places]
    if order != "topology":
        raise ValueError(f"ring order {order!r}: use 'topology' or 'rank'")
    leaves: dict[str, int] = {}
    hosts: dict[str, int] = {}
    for p in places:  # first appearance fixes the order of leaves and hosts
        leaves.setdefault(p.leaf, len(leaves))
        hosts.setdefault(p.host, len(hosts))
    return [
        p.rank for p in sorted(places, key=lambda p: (leaves[p.leaf], hosts[p.host], p.local_rank))
    ]


@dataclass(frozen=True, slots=True)
class CommOptions:
    """How a communicator connects and how long it waits (every rank of a job uses the same)."""

    job: str = "job"  # names the job's keys in the store
    order: str = "topology"  # ring order: "topology" (leaf-major, host-major) or "rank"
    slots: int = 4  # receive slots per link: chunks in flight
    slot_bytes: int = 256 << 10  # bytes per slot (a chunk)
    timeout: float = 0.05  # base deadline of an operation, emulated seconds (more for larger)
    link_gbps: float = 100.0  # the hosts' link rate, for deadlines that scale with size
    mtu: int = 4096
    qp_timeout: int = 10  # QP local ACK timeout code: 4.096 us * 2^N
    retry_cnt: int = 7

    @classmethod
    def for_job(
        cls, link_gbps: float, mtu: int, retry_cnt: int, params: dict[str, Any]
    ) -> CommOptions:
        """A job's options: the fabric's link rate, MTU and retries, and the job's parameters
        (``job_id``, ``order``, ``slots``, ``slot_bytes``, ``timeout``, ``qp_timeout``)."""
        return cls(
            job=str(params.get("job_id", "job")),
            order=str(params.get("order", "topology")),
            slots=int(params.get("slots", 4)),
            slot_bytes=int(params.get("slot_bytes", 256 << 10)),
            timeout=float(params.get("timeout", 0.05)),
            link_gbps=link_gbps,
            mtu=mtu,
            qp_timeout=int(params.get("qp_timeout", 10)),
            retry_cnt=retry_cnt,
        )
