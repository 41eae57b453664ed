"""The Grafana dashboards and provisioning of the testbed, as data.

Three dashboards, each panel a PromQL expression over the metrics the nodes serve, with its
unit set: **Fabric** (switch ports: throughput per link, egress queue depth, ECN marks, PFC
frames sent and received per priority, watchdog storms, drops by reason), **Transport** (NICs:
CNPs sent and handled, DCQCN rate, target and alpha per QP, retransmissions, sequence errors,
timeouts) and **Collectives** (ranks: operation latency p50 / p99, bus bandwidth, errors).
Every rate is per *emulated* second: Prometheus's ``rate()`` is per wall second, so each is
divided by the rate of the serving node's own clock (``rocev2_emulated_seconds_total``, matched
on ``instance``) - right on the exact clock (however fast or paced the run), on the wall clock
at any TDF, and blank where the clock stood still.
The datasource is provisioned with the fixed uid ``rocev2-prometheus`` and every panel names
it, so no ``${DS_...}`` placeholder is left for an import dialog.  :mod:`rocev2_emu.testbed.compose`
writes them under ``deploy/grafana``; the test against a real Prometheus runs every ``expr``.
"""

from __future__ import annotations

import json
from typing import Any

DATASOURCE_UID = "rocev2-prometheus"
RATE = "[30s]"
# the emulated seconds each scrape target's clock advanced per wall second (where it did):
# Prometheus's rates are per wall second, the fabric's per emulated second
CLOCK_RATE = f"(rate(rocev2_emulated_seconds_total{RATE}) > 0)"


def per_emulated_second(expr: str) -> str:
    """``expr``, a rate per wall second keeping the ``instance`` label, per emulated second of
    the node that served it (whatever the clock: exact, dilated, paced)."""
    return f"{expr} / on(instance) group_left() {CLOCK_RATE}"


def rate_of(counter: str) -> str:
    """A counter's rate per emulated second."""
    return per_emulated_second(f"rate({counter}{RATE})")


def bits_rate(counter: str) -> str:
    """A byte counter's rate per emulated second, in bits."""
    return per_emulated_second(f"rate({counter}{RATE}) * 8")


def summed_rate(by: str, counter: str) -> str:
    """A counter's rate per emulated second, summed by the labels ``by`` of each node."""
    return per_emulated_second(f"sum by (instance, {by}) (rate({counter}{RATE}))")


# (title, unit, [(expr, legend)])
Panel = tuple[str, str, list[tuple[str, str]]]

FABRIC: list[Panel] = [
    (
        "Link throughput (switch egress)",
        "bps",
        [
            (
                bits_rate("rocev2_switch_tx_bytes_total"),
                "{{node}} -> {{peer}}",
            )
        ],
    ),
    (
        "Egress queue depth",
        "bytes",
        [("sum by (node, peer) (rocev2_switch_queue_bytes)", "{{node}} -> {{peer}}")],
    ),
    ("Shared buffer occupancy", "bytes", [("rocev2_switch_buffer_bytes", "{{node}}")]),
    (
        "ECN marks",
        "pps",
        [
            (
                summed_rate("node, peer", "rocev2_switch_ecn_marked_packets_total"),
                "{{node}} -> {{peer}}",
            )
        ],
    ),
    (
        "PFC pause frames sent, per priority",
        "pps",
        [
            (
                summed_rate("node, priority", "rocev2_switch_pfc_tx_frames_total"),
                "{{node}} prio {{priority}}",
            )
        ],
    ),
    (
        "PFC pause frames received, per priority",
        "pps",
        [
            (
                summed_rate("node, priority", "rocev2_switch_pfc_rx_frames_total"),
                "{{node}} prio {{priority}}",
            ),
            (
                summed_rate("node, priority", "rocev2_nic_rx_pause_frames_total"),
                "NIC {{node}} prio {{priority}}",
            ),
        ],
    ),
    (
        "Time paused (fraction of each emulated second)",
        "percentunit",
        [
            (
                summed_rate("node, peer", "rocev2_switch_paused_seconds_total"),
                "{{node}} -> {{peer}}",
            )
        ],
    ),
    (
        "PFC watchdog storms",
        "short",
        [
            (
                "sum by (node) (rocev2_switch_pfc_watchdog_storms_detected_total)",
                "{{node}} detected",
            ),
            (
                "sum by (node) (rocev2_switch_pfc_watchdog_storms_restored_total)",
                "{{node}} restored",
            ),
        ],
    ),
    (
        "Drops by reason",
        "pps",
        [
            (
                summed_rate("node, reason", "rocev2_switch_dropped_packets_total"),
                "{{node}} {{reason}}",
            )
        ],
    ),
]

TRANSPORT: list[Panel] = [
    (
        "CNPs sent (notification point) and handled (reaction point)",
        "pps",
        [
            (rate_of("rocev2_nic_np_cnp_sent_total"), "{{node}} sent"),
            (
                rate_of("rocev2_nic_rp_cnp_handled_total"),
                "{{node}} handled",
            ),
        ],
    ),
    (
        "DCQCN current rate per QP",
        "bps",
        [("rocev2_nic_qp_rate_bits_per_second", "{{node}} QP {{qp}}")],
    ),
    (
        "DCQCN target rate per QP",
        "bps",
        [("rocev2_nic_qp_target_rate_bits_per_second", "{{node}} QP {{qp}}")],
    ),
    ("DCQCN alpha per QP", "percentunit", [("rocev2_nic_qp_alpha", "{{node}} QP {{qp}}")]),
    (
        "Retransmitted packets (go-back-N)",
        "pps",
        [(rate_of("rocev2_nic_retransmitted_packets_total"), "{{node}}")],
    ),
    (
        "Sequence errors",
        "pps",
        [
            (
                rate_of("rocev2_nic_packet_seq_err_total"),
                "{{node}} NAK seq err",
            ),
            (
                rate_of("rocev2_nic_out_of_sequence_total"),
                "{{node}} out of sequence",
            ),
        ],
    ),
    (
        "Timeouts and exhausted retries",
        "short",
        [
            ("rocev2_nic_local_ack_timeout_err_total", "{{node}} ACK timeouts"),
            ("rocev2_nic_retry_exceeded_err_total", "{{node}} retries exceeded"),
        ],
    ),
    (
        "NIC throughput",
        "bps",
        [(bits_rate("rocev2_nic_tx_bytes_total"), "{{node}} tx")],
    ),
]

COLLECTIVES: list[Panel] = [
    (
        "Operation latency p50 per rank (emulated)",
        "s",
        [
            (
                "histogram_quantile(0.5, sum by (le, rank) "
                f"(rate(rocev2_collective_operation_seconds_bucket{RATE})))",
                "rank {{rank}}",
            )
        ],
    ),
    (
        "Operation latency p99 per rank (emulated): stragglers show here",
        "s",
        [
            (
                "histogram_quantile(0.99, sum by (le, rank) "
                f"(rate(rocev2_collective_operation_seconds_bucket{RATE})))",
                "rank {{rank}}",
            )
        ],
    ),
    (
        "Bus bandwidth of the last operation",
        "Bps",
        [("rocev2_collective_busbw_bytes_per_second", "rank {{rank}} {{op}}")],
    ),
    (
        "Algorithm bandwidth of the last operation",
        "Bps",
        [("rocev2_collective_algbw_bytes_per_second", "rank {{rank}} {{op}}")],
    ),
    (
        "Bytes reduced or gathered",
        "Bps",
        [
            (
                summed_rate("rank", "rocev2_collective_bytes_total"),
                "rank {{rank}}",
            )
        ],
    ),
    ("Errors", "short", [("sum by (rank) (rocev2_collective_errors_total)", "rank {{rank}}")]),
    (
        "Training step: communication on the fabric vs modelled compute (emulated)",
        "s",
        [
            ("rocev2_torch_step_communication_seconds", "rank {{rank}} communication"),
            ("rocev2_torch_step_exposed_communication_seconds", "rank {{rank}} exposed"),
            ("rocev2_torch_step_compute_seconds", "rank {{rank}} compute (model)"),
        ],
    ),
    (
        "Training step: interconnect tax (exposed communication / compute)",
        "percentunit",
        [("rocev2_torch_step_interconnect_tax_ratio", "rank {{rank}}")],
    ),
]
TRAINING_ONLY = "rocev2_torch_"  # series that exist only while a PyTorch job runs (launch)

DASHBOARDS = {
    "fabric": ("rocev2-fabric", "RoCEv2 fabric: links, queues, ECN, PFC", FABRIC),
    "transport": ("rocev2-transport", "RoCEv2 transport: DCQCN and go-back-N", TRANSPORT),
    "collectives": ("rocev2-collectives", "Collectives: latency, bandwidth, errors", COLLECTIVES),
}


def dashboard(uid: str, title: str, panels: list[Panel]) -> dict[str, Any]:
    ds = {"type": "prometheus", "uid": DATASOURCE_UID}
    out = []
    for i, (panel_title, unit, targets) in enumerate(panels):
        out.append(
            {
                "id": i + 1,
                "type": "timeseries",
                "title": panel_title,
                "datasource": ds,
                "gridPos": {"h": 8, "w": 12, "x": 12 * (i % 2), "y": 8 * (i // 2)},
                "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
                "targets": [
                    {"refId": chr(65 + k), "datasource": ds, "expr": expr, "legendFormat": legend}
                    for k, (expr, legend) in enumerate(targets)
                ],
            }
        )
    return {
        "uid": uid,
        "title": title,
        "tags": ["rocev2-emu"],
        "timezone": "browser",
        "schemaVersion": 39,
        "refresh": "5s",
        "time": {"from": "now-15m", "to": "now"},
        "panels": out,
    }


def files() -> dict[str, str]:
    """Paths under deploy/grafana -> contents."""
    out = {
        f"dashboards/{name}.json": json.dumps(dashboard(uid, title, panels), indent=2) + "\n"
        for name, (uid, title, panels) in DASHBOARDS.items()
    }
    out["provisioning/datasources/prometheus.yml"] = (
        "apiVersion: 1\n"
        "datasources:\n"
        "  - name: Prometheus\n"
        "    type: prometheus\n"
        f"    uid: {DATASOURCE_UID}\n"
        "    access: proxy\n"
        "    url: http://prometheus:9090\n"
        "    isDefault: true\n"
    )
    out["provisioning/dashboards/rocev2-emu.yml"] = (
        "apiVersion: 1\n"
        "providers:\n"
        "  - name: rocev2-emu\n"
        "    type: file\n"
        "    options:\n"
        "      path: /var/lib/grafana/dashboards\n"
    )
    return out


def expressions(text: str) -> list[str]:
    """Every PromQL ``expr`` of a dashboard's JSON."""
    return [t["expr"] for p in json.loads(text)["panels"] for t in p["targets"]]
