"""Prometheus metrics of a NIC, named after the mlx5 / rxe counters users already know.

A custom collector reads the sans-IO core's plain counters at scrape time, so the data path
pays nothing for metrics.  Names follow Prometheus conventions (base units, ``_total``
counters, labels for node, reason and priority); the pump's own health and the TDF come from
:func:`rocev2_emu.runtime.metrics.pump_metrics`.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from rocev2_emu.cc import Dcqcn
from rocev2_emu.runtime.metrics import node_counter, pump_metrics

if TYPE_CHECKING:
    from rocev2_emu.nic.driver import EngineNic, NicDriver

HELP = {
    "tx_packets": "Ethernet frames sent by the NIC port",
    "tx_bytes": "Ethernet frame bytes sent (no FCS)",
    "rx_packets": "Datagrams received by the NIC port",
    "rx_bytes": "Ethernet frame bytes received (no FCS)",
    "packet_seq_err": "NAK-sequence-error packets received by requesters (mlx5 packet_seq_err)",
    "implied_nak_seq_err": "Implied NAKs: missing READ/atomic responses (mlx5)",
    "local_ack_timeout_err": "Local ACK timer expirations (mlx5 local_ack_timeout_err)",
    "retransmitted_packets": "Packets sent again by go-back-N recovery",
    "rnr_nak_received": "RNR NAKs received by requesters",
    "rnr_nak_retry_err": "RNR retries exhausted (mlx5 rnr_nak_retry_err)",
    "retry_exceeded_err": "Transport retries exhausted",
    "req_remote_access_errors": "Remote access error NAKs received (mlx5)",
    "req_remote_invalid_request": "Invalid request NAKs received (mlx5)",
    "duplicate_response": "Responses for already acknowledged PSNs",
    "ghost_response": "Responses for PSNs never sent",
    "out_of_sequence": "Request packets ahead of the expected PSN (mlx5 out_of_sequence)",
    "duplicate_request": "Request packets behind the expected PSN (mlx5 duplicate_request)",
    "out_of_buffer": "RNR NAKs sent for lack of a posted receive (mlx5 out_of_buffer)",
    "resp_remote_access_errors": "Remote access errors detected as responder (mlx5)",
    "resp_invalid_request": "Invalid requests detected as responder",
    "resp_local_length_error": "SENDs longer than the posted receive (mlx5)",
    "rx_write_requests": "RDMA WRITE messages received (mlx5 rx_write_requests)",
    "rx_read_requests": "RDMA READ requests received (mlx5 rx_read_requests)",
    "rx_atomic_requests": "Atomic requests received (mlx5 rx_atomic_requests)",
    "np_ecn_marked_roce_packets": "RoCE packets received with CE (mlx5)",
    "cnp_received": "CNPs received",
    "rp_cnp_ignored": "CNPs for a QP that is gone or has no rate control (mlx5)",
    "req_cqe_error": "Send completions with an error other than a flush (mlx5)",
    "req_cqe_flush_error": "Send completions flushed by a QP in error (mlx5)",
}


class NicCollector(Collector):
    def __init__(self, driver: NicDriver | EngineNic, node: str) -> None:
        self.driver = driver
        self.node = node

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        core = self.driver.core
        node = self.node
        for name, value in core.counters.as_dict().items():
            fam = CounterMetricFamily(f"rocev2_nic_{name}", HELP.get(name, name), labels=["node"])
            fam.add_metric([node], value)
            yield fam
        drops = CounterMetricFamily(
            "rocev2_nic_rx_dropped_packets",
            "Received frames dropped, by reason",
            labels=["node", "reason"],
        )
        for reason, value in sorted(core.counters.rx_drops.items()):
            drops.add_metric([node, reason], value)
        yield drops
        for direction, counts in (
            ("rx", core.pause_frames_received),
            ("tx", core.pause_frames_sent),
        ):
            pause = CounterMetricFamily(
                f"rocev2_nic_{direction}_pause_frames",
                f"PFC pause frames {'received' if direction == 'rx' else 'sent'} per priority "
                f"(mlx5 {direction}_prioN_pause)",
                labels=["node", "priority"],
            )
            for prio, value in enumerate(counts):
                pause.add_metric([node, str(prio)], value)
            yield pause
        rate = GaugeMetricFamily(
            "rocev2_nic_qp_rate_bits_per_second", "DCQCN current rate per QP", labels=["node", "qp"]
        )
        target = GaugeMetricFamily(
            "rocev2_nic_qp_target_rate_bits_per_second",
            "DCQCN target rate per QP",
            labels=["node", "qp"],
        )
        alpha = GaugeMetricFamily(
            "rocev2_nic_qp_alpha", "DCQCN alpha per QP", labels=["node", "qp"]
        )
        for qp in list(core.qps.values()):
            rc = qp.rc
            if isinstance(rc, Dcqcn):
                label = [node, f"0x{qp.qpn:06x}"]
                rate.add_metric(label, rc.rate)
                target.add_metric(label, rc.target)
                alpha.add_metric(label, rc.alpha)
        yield from (rate, target, alpha)
        yield node_counter(
            "rocev2_nic_tx_behind_schedule",
            "Frames sent after their line-rate slot",
            node,
            core.tx_behind_schedule,
        )
        yield from pump_metrics(self.driver, node)
        qps = GaugeMetricFamily(
            "rocev2_nic_queue_pairs", "Queue pairs by state", labels=["node", "state"]
        )
        states: dict[str, int] = {}
        for qp in list(core.qps.values()):
            states[qp.state.name] = states.get(qp.state.name, 0) + 1
        for state, count in sorted(states.items()):
            qps.add_metric([node, state], count)
        yield qps


def nic_registry(driver: NicDriver | EngineNic, node: str) -> CollectorRegistry:
    registry = CollectorRegistry()
    registry.register(NicCollector(driver, node))
    return registry
