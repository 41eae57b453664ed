"""perftest's options and what both sides share: the tests, the sizes, one side's resources,
and what a server accepts of a client's parameters (a bad one is refused, not run)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final, cast

import numpy as np

from rocev2_emu.fabric.options import Clock
from rocev2_emu.runtime.link import LinkFaults
from rocev2_emu.transport.work import (
    WcStatus,
    WorkCompletion,
)
from rocev2_emu.verbs.api import CQ, MR, PD, QP, Context
from rocev2_emu.verbs.oob import DEFAULT_OOB_PORT, QPInfo
from rocev2_emu.wire.ethernet import LINK_UDP_PORT

LINE: Final = "-" * 87
TITLES: Final = {
    "write_bw": "RDMA_Write BW Test",
    "write_lat": "RDMA_Write Latency Test",
    "send_bw": "Send BW Test",
    "read_bw": "RDMA_Read BW Test",
}
ALL_SIZES: Final = [1 << k for k in range(1, 24)]  # perftest -a: 2 B .. 8 MiB


@dataclass(slots=True)
class PerftestOptions:
    test: str
    server: str | None = None  # None: this is the server
    oob_port: int = DEFAULT_OOB_PORT
    oob_addr: str = "127.0.0.1"
    size: int = 65536
    iters: int = 5000
    duration: float = 0.0  # emulated seconds; 0: run ``iters`` iterations
    all_sizes: bool = False
    qps: int = 1
    mtu: int = 4096
    report_gbits: bool = False
    tx_depth: int = 128
    nic_addr: str = "127.0.0.2"
    nic_port: int = LINK_UDP_PORT
    rate_gbps: float = 100.0
    tdf: float = 100.0
    faults: LinkFaults = field(default_factory=LinkFaults)
    pcap: str | None = None
    metrics_port: int = 0
    qp_timeout: int = 14
    retry_cnt: int = 7
    connect_timeout: float = 60.0  # wall seconds to find the peer
    clock: Clock = Clock.WALL  # wall (dilated, TDF), exact (a pair of processes), virtual
    delay_us: float = 1.0  # the engine's link delay (exact, virtual): its lookahead

    def link_settings(self) -> dict[str, float]:
        """The link both sides of a pair on the event engine must agree on."""
        return {
            "rate_gbps": self.rate_gbps,
            "delay_us": self.delay_us,
            "loss": self.faults.loss,
            "seed": self.faults.seed,
        }

    @property
    def is_server(self) -> bool:
        return self.server is None


class PerftestError(Exception):
    """A test could not run or a work request failed; the message says which and why."""


@dataclass(slots=True)
class Side:
    ctx: Context
    pd: PD
    cq: CQ
    mr: MR
    buf: np.ndarray
    qps: list[QP]
    remote: list[QPInfo]
    max_size: int
    cq_timeout: float
    per_qp: int
    receives_posted: bool = False  # send_bw's server: its receive queues are full


# what a client may ask of a server: (type, lowest, highest); the server allocates size x qps
CLIENT_PARAMS: Final[dict[str, tuple[type | tuple[type, ...], float, float]]] = {
    "size": (int, 1, 1 << 31),
    "iters": (int, 1, 1 << 40),
    "duration": ((int, float), 0, 24 * 3600),
    "all_sizes": (bool, False, True),
    "qps": (int, 1, 1024),
    "mtu": (int, 256, 4096),
    "tx_depth": (int, 1, 1 << 16),
}
MAX_BUFFER: Final = 1 << 32  # bytes a server registers for a client, at most


def mismatch(params: object, opts: PerftestOptions) -> str | None:
    """Why the client's parameters cannot run against this server, or None."""
    if not isinstance(params, dict) or params.get("test") != opts.test:
        return f"client runs {params!r:.200}, this server runs {opts.test}"
    for key, (kind, low, high) in CLIENT_PARAMS.items():
        value = params.get(key)
        typed = isinstance(value, kind) and (kind is bool or not isinstance(value, bool))
        if not typed or not low <= cast(float, value) <= high:
            return f"the client's {key} = {value!r:.80} is not one of {low}..{high}"
    if params["mtu"] not in (256, 512, 1024, 2048, 4096):
        return f"the client's mtu = {params['mtu']} is not a path MTU"
    if params["size"] * params["qps"] > MAX_BUFFER:
        return f"the client asks for {params['size'] * params['qps']} bytes, over {MAX_BUFFER}"
    if opts.clock is not Clock.WALL and params.get("link") != opts.link_settings():
        return (
            f"the client's link is {params.get('link')!r:.200}, this server's "
            f"{opts.link_settings()}: start both sides with the same --rate, --delay-us, --loss "
            "and --seed (each end's frames take its own link settings)"
        )
    for key, what in (("tdf", "TDF"), ("rate_gbps", "link rate (Gbit/s)")):
        theirs, ours = params.get(key), getattr(opts, key)
        if theirs != ours:
            return (
                f"the client's {what} is {theirs}, this server's {ours}: start both sides "
                "with the same --tdf and --rate (emulated time would not agree)"
            )
    return None


def sizes(opts: PerftestOptions) -> list[int]:
    return ALL_SIZES if opts.all_sizes else [opts.size]


def check(wcs: list[WorkCompletion]) -> None:
    for wc in wcs:
        if wc.status is not WcStatus.SUCCESS:
            raise PerftestError(
                f"completion with error: wr_id {wc.wr_id} status "
                f"{wc.status.name} ({int(wc.status)}) on QP 0x{wc.qp_num:06x}"
            )
