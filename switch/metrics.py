"""Prometheus metrics of a switch, per port and priority, named after SAI port and queue
statistics (``SAI_PORT_STAT_PFC_3_TX_PKTS``, ``SAI_QUEUE_STAT_WATERMARK_BYTES``, ...) in
Prometheus style: base units, ``_total`` counters, labels for node (the switch, as on the NICs),
port, peer and priority.
Read from the pipeline's plain counters at scrape time; the data path pays nothing.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from rocev2_emu.runtime.metrics import pump_metrics
from rocev2_emu.wire.qos import PRIORITIES
from switch.driver import EngineSwitch, SwitchDriver

DROP_REASONS = frozenset(
    {"buffer", "headroom", "link_down", "malformed", "no_route", "ttl", "ipv4_checksum"}
    | {"pfc_watchdog", "pfc_no_class_enabled", "not_from_peer"}
)


class SwitchCollector(Collector):
    def __init__(self, driver: SwitchDriver | EngineSwitch) -> None:
        self.driver = driver

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        core = self.driver.core
        name = core.config.name
        now = self.driver.clock.now_threadsafe()
        port_labels = ["node", "port", "peer"]
        prio_labels = [*port_labels, "priority"]

        def family(
            kind: type, metric: str, doc: str, labels: list[str]
        ) -> CounterMetricFamily | GaugeMetricFamily:
            return kind(f"rocev2_switch_{metric}", doc, labels=labels)  # type: ignore[no-any-return]

        fams = {
            "rx_packets": family(CounterMetricFamily, "rx_packets", "Frames received", port_labels),
            "rx_bytes": family(
                CounterMetricFamily, "rx_bytes", "Frame bytes received", port_labels
            ),
            "tx_packets": family(CounterMetricFamily, "tx_packets", "Frames sent", port_labels),
            "tx_bytes": family(CounterMetricFamily, "tx_bytes", "Frame bytes sent", port_labels),
        }
        drops = family(
            CounterMetricFamily,
            "dropped_packets",
            "Frames dropped, by reason",
            [*port_labels, "reason"],
        )
        ecn = family(
            CounterMetricFamily, "ecn_marked_packets", "Packets marked CE at dequeue", prio_labels
        )
        pfc_tx = family(
            CounterMetricFamily, "pfc_tx_frames", "PFC frames sent upstream", prio_labels
        )
        pfc_rx = family(CounterMetricFamily, "pfc_rx_frames", "PFC frames received", prio_labels)
        paused = family(
            CounterMetricFamily,
            "paused_seconds",
            "Time the egress queue was paused by the neighbour (emulated)",
            prio_labels,
        )
        depth = family(GaugeMetricFamily, "queue_bytes", "Egress queue depth", prio_labels)
        storms = family(
            CounterMetricFamily,
            "pfc_watchdog_storms_detected",
            "PFC storms detected by the watchdog",
            prio_labels,
        )
        restored = family(
            CounterMetricFamily,
            "pfc_watchdog_storms_restored",
            "Queues restored by the watchdog",
            prio_labels,
        )
        wd = core.watchdog
        for i, (cfg, ps) in enumerate(zip(core.config.ports, core.ports, strict=True)):
            labels = [name, str(i), cfg.peer_name]
            for key, fam in fams.items():
                fam.add_metric(labels, getattr(ps, key))
            # every known reason, zeros included, so dashboards have a series before a drop
            for reason in sorted(DROP_REASONS | set(ps.drops)):
                drops.add_metric([*labels, reason], ps.drops.get(reason, 0))
            for prio in range(PRIORITIES):
                pl = [*labels, str(prio)]
                ecn.add_metric(pl, ps.ecn_marked[prio])
                pfc_tx.add_metric(pl, ps.pfc_tx[prio])
                pfc_rx.add_metric(pl, ps.pfc_rx[prio])
                paused.add_metric(pl, ps.paused_seconds(prio, now))
                depth.add_metric(pl, ps.queue_bytes[prio])
                storms.add_metric(pl, wd.storms_detected[i][prio])
                restored.add_metric(pl, wd.storms_restored[i][prio])
        yield from fams.values()
        yield from (drops, ecn, pfc_tx, pfc_rx, paused, depth, storms, restored)
        buf = GaugeMetricFamily(
            "rocev2_switch_buffer_bytes", "Shared buffer occupancy", labels=["node"]
        )
        buf.add_metric([name], core.mmu.total)
        yield buf
        mode = GaugeMetricFamily(
            "rocev2_switch_ecmp_mode",
            "How the switch picks among equal-cost ports (1 for the mode in use)",
            labels=["node", "mode"],
        )
        mode.add_metric([name, core.config.ecmp], 1)
        yield mode
        yield from pump_metrics(self.driver, name)
