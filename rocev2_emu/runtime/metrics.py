"""What every node process exports besides its own counters: the health of its pump, and the
``/metrics`` server.

:func:`pump_metrics` yields, for one pump, the kernel's drops at its UDP socket, its late
wake-ups, the emulated time its clock has reached (``rocev2_emulated_seconds_total``: the
dashboards divide rates by its rate, so they show them per emulated second on any clock), the
TDF the process runs at (``rocev2_emulation_tdf``) and the batched I/O its socket uses
(``rocev2_batch_io{mode}``).
The NIC's and the switch's collectors add these to their own families; both read plain
counters at scrape time, so the data path pays nothing for metrics.
"""

from __future__ import annotations

import selectors
import socket
import threading
from collections.abc import Iterator
from socketserver import TCPServer, ThreadingMixIn
from typing import Any, Protocol
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from rocev2_emu.control.channel import DROPPED, REJECTED
from rocev2_emu.runtime.clock import DilatedClock, Late
from rocev2_emu.runtime.ports import PortInfo, batch_mode


class Driven(Late, Protocol):
    """A core's driver as the metrics see it: a pump, or a node of the virtual-time engine."""

    @property
    def port(self) -> PortInfo: ...

    @property
    def clock(self) -> DilatedClock: ...


def node_counter(name: str, documentation: str, node: str, value: float) -> CounterMetricFamily:
    """A counter family of one sample, labelled with the node."""
    family = CounterMetricFamily(name, documentation, labels=["node"])
    family.add_metric([node], value)
    return family


def pump_metrics(pump: Driven, node: str) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
    """The per-process families of one node (label ``node``)."""
    yield node_counter(
        "rocev2_emulation_late_wakeups",
        "Driver wake-ups later than their deadline (run unfaithful)",
        node,
        pump.late_wakeups,
    )
    yield node_counter(
        "rocev2_emulation_late_seconds",
        "Emulated seconds the late wake-ups came behind their deadlines, summed",
        node,
        pump.late_seconds,
    )
    yield node_counter(
        "rocev2_socket_rx_dropped_packets",
        "Datagrams the kernel dropped at this node's UDP socket",
        node,
        pump.port.kernel_drops(),
    )
    yield node_counter(
        "rocev2_emulated_seconds",
        "Emulated time this node's clock has reached: a rate over wall time divided by this "
        "counter's rate is a rate per emulated second (the dashboards' panels)",
        node,
        max(pump.clock.now_threadsafe(), 0.0),
    )
    tdf = GaugeMetricFamily(
        "rocev2_emulation_tdf", "Time-dilation factor of this process", labels=["node"]
    )
    tdf.add_metric([node], pump.clock.tdf)
    yield tdf
    batch = GaugeMetricFamily(
        "rocev2_batch_io",
        "Batched wire I/O in use at this node's UDP socket (1 for its mode: gso+gro, gso, gro "
        "or off)",
        labels=["node", "mode"],
    )
    batch.add_metric([node, batch_mode(pump.port)], 1.0)
    yield batch


def serve(registry: CollectorRegistry, port: int, addr: str = "127.0.0.1") -> None:
    """Serve ``/metrics`` on ``addr:port`` from a background thread (prometheus-client's WSGI
    app), with the process's refused control requests and dropped control connections beside
    ``registry``'s own families."""
    serve_nodes({addr: registry}, port)


class _Chained:
    """The metrics of several registries as one collector."""

    def __init__(self, registries: list[CollectorRegistry]) -> None:
        self.registries = registries

    def collect(self) -> Iterator[Metric]:
        for registry in self.registries:
            yield from registry.collect()


def merged(registries: list[CollectorRegistry]) -> CollectorRegistry:
    """One registry serving the metrics of ``registries`` (the nodes of a process that share
    an address; their series carry ``node``): the one, or a registry collecting them all."""
    if len(registries) == 1:
        return registries[0]
    registry = CollectorRegistry()
    registry.register(_Chained(registries))
    return registry


def serve_nodes(registries: dict[str, CollectorRegistry], port: int) -> None:
    """:func:`serve` for each node of a process at its own address (``{address: registry}``),
    all from one background thread that accepts on every address (each scrape is answered in
    a short-lived thread of its own, as prometheus-client's server does): a process hosting a
    hundred nodes (``--workers``) keeps one thread for them, not a hundred polling ones that
    would take the interpreter's lock from its engine twice a second each."""
    servers = []
    for addr, registry in registries.items():
        registry.register(REJECTED)
        registry.register(DROPPED)
        server_class = _Server6 if ":" in addr else _Server
        app = make_wsgi_app(registry)
        servers.append(make_server(addr, port, app, server_class, handler_class=_Quiet))
    threading.Thread(target=_accept, args=(servers,), name="metrics", daemon=True).start()


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True

    def server_bind(self) -> None:
        """Bind as ``HTTPServer`` does, without its ``socket.getfqdn`` of the address: a reverse
        DNS lookup that took 97 ms per node here (20 s for the 208 of a k = 8 fat-tree in one
        process, measured) for a name nothing reads."""
        TCPServer.server_bind(self)
        host, port = self.server_address[:2]
        self.server_name, self.server_port = str(host), int(port)
        self.setup_environ()


class _Server6(_Server):
    address_family = socket.AF_INET6


class _Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """No line on stderr per scrape."""


def _accept(servers: list[_Server]) -> None:
    with selectors.DefaultSelector() as ready:
        for server in servers:
            ready.register(server, selectors.EVENT_READ)
        while True:
            for key, _ in ready.select():
                key.fileobj.handle_request()  # type: ignore[union-attr]
