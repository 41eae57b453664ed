"""Per-rank Prometheus metrics of the collectives.

Names follow Prometheus conventions with the ``rocev2_collective_`` prefix and labels ``rank`` and
``op``: an operation-latency histogram in emulated seconds (buckets from 1 us to 10 s, so the
straggler's tail shows in its p99), bytes moved, the algorithm and bus bandwidth of the last
operation (nccl-tests' algbw and busbw, bytes per emulated second), errors, and the operation in
progress (bytes received so far and the bytes nccl-tests' bus factor says a rank receives in it:
the live map's progress within an operation, read from the session when scraped).  One registry
per process; ranks sharing a host process share it, told apart by ``rank``.

:class:`StepMetrics`: a PyTorch rank's training steps (``rocev2_torch_step_*``): the step's
communication on the fabric, the modelled compute, the exposed part and the tax.
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

OPERATIONS = ("all_reduce", "reduce_scatter", "all_gather", "broadcast", "reduce")
BUCKETS = (*(m * 10.0**e for e in range(-6, 1) for m in (1, 2, 5)), 10.0)


class HostCollectiveMetrics:
    """The metric families of one process; :meth:`rank` gives one rank's view."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry  # the process's: the server fabric's metrics join it
        self.latency = Histogram(
            "rocev2_collective_operation_seconds",
            "Collective operation latency, emulated seconds",
            ["rank", "op"],
            buckets=BUCKETS,
            registry=registry,
        )
        self.operations = Counter(  # the histogram's count, without its buckets: the map's
            "rocev2_collective_operations",  # progress reads it for every rank, every sample
            "Collective operations finished",
            ["rank", "op"],
            registry=registry,
        )
        self.bytes = Counter(
            "rocev2_collective_bytes",
            "Bytes reduced or gathered by collectives",
            ["rank", "op"],
            registry=registry,
        )
        self.algbw = Gauge(
            "rocev2_collective_algbw_bytes_per_second",
            "Algorithm bandwidth of the last operation (bytes / emulated second)",
            ["rank", "op"],
            registry=registry,
        )
        self.busbw = Gauge(
            "rocev2_collective_busbw_bytes_per_second",
            "Bus bandwidth of the last operation (algbw x nccl-tests' factor)",
            ["rank", "op"],
            registry=registry,
        )
        self.errors = Counter(
            "rocev2_collective_errors",
            "Collective operations that failed",
            ["rank", "op"],
            registry=registry,
        )
        # the operation in progress, read when scraped (the live map's progress within an op)
        self.op_received = Gauge(
            "rocev2_collective_op_received_bytes",
            "Bytes this rank has received in the operation in progress (0 between operations)",
            ["rank"],
            registry=registry,
        )
        self.op_expected = Gauge(
            "rocev2_collective_op_expected_bytes",
            "Bytes a rank receives in the operation in progress by nccl-tests' bus factor "
            "(size x factor; 0 between operations)",
            ["rank"],
            registry=registry,
        )
        self.registry = registry

    def rank(self, rank: int) -> RankMetrics:
        return RankMetrics(self, str(rank))


class RankMetrics:
    def __init__(self, families: HostCollectiveMetrics, rank: str) -> None:
        self.families = families
        self.rank_label = rank
        self.errors = _Bound(families.errors, rank)
        for op in OPERATIONS:  # a zero series from the start, so "no errors" shows as 0
            families.errors.labels(rank=rank, op=op).inc(0)

    def progress(self, received: Callable[[], float], expected: Callable[[], float]) -> None:
        """Read the operation in progress from these two functions whenever scraped."""
        self.families.op_received.labels(rank=self.rank_label).set_function(received)
        self.families.op_expected.labels(rank=self.rank_label).set_function(expected)

    def observe(self, op: str, nbytes: int, seconds: float, bus_factor: float) -> None:
        f, r = self.families, self.rank_label
        f.latency.labels(rank=r, op=op).observe(seconds)
        f.operations.labels(rank=r, op=op).inc()
        f.bytes.labels(rank=r, op=op).inc(nbytes)
        algbw = nbytes / seconds if seconds > 0 else 0.0
        f.algbw.labels(rank=r, op=op).set(algbw)
        f.busbw.labels(rank=r, op=op).set(algbw * bus_factor)


class _Bound:
    """``counter.labels(op=...)`` with the rank label already applied."""

    def __init__(self, counter: Counter, rank: str) -> None:
        self.counter = counter
        self.rank = rank

    def labels(self, *, op: str) -> Counter:
        return self.counter.labels(rank=self.rank, op=op)


class StepMetrics:
    """The interconnect tax per training step, as Prometheus series on the host's registry
    (:mod:`collectives.pytorch.accounting` computes them; a PyTorch rank's)."""

    def __init__(self, registry: CollectorRegistry, rank: int) -> None:
        r = str(rank)
        labels = ["rank"]
        self.steps = Counter(
            "rocev2_torch_steps", "Training steps reported", labels, registry=registry
        ).labels(r)
        self.compute = Gauge(
            "rocev2_torch_step_compute_seconds",
            "Modelled accelerator compute of the last step, emulated seconds",
            labels,
            registry=registry,
        ).labels(r)
        self.communication = Gauge(
            "rocev2_torch_step_communication_seconds",
            "Collectives of the last step on the fabric, emulated seconds",
            labels,
            registry=registry,
        ).labels(r)
        self.exposed = Gauge(
            "rocev2_torch_step_exposed_communication_seconds",
            "Communication of the last step not hidden under its compute, emulated seconds",
            labels,
            registry=registry,
        ).labels(r)
        self.tax = Gauge(
            "rocev2_torch_step_interconnect_tax_ratio",
            "Exposed communication / compute of the last step",
            labels,
            registry=registry,
        ).labels(r)
