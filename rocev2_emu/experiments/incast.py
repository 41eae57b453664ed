"""``incast``: N -> 1 (N = 8) with no PFC and no DCQCN (drops, retransmissions), PFC only (no
loss, pauses), PFC + DCQCN (CNPs, fewer pauses), and PFC with every sender's NIC pacing at C/N
(no pause at all), with flow completion times p50 / p99.

At scale: ``--senders N`` (and ``--size`` bytes per sender) on the scenario's one switch, or on
a ``--topology`` file (its first N hosts into its last: ``rocev2-emu topology fat-tree -k 16``
gives the seed's 1023 -> 1), and ``--settings`` to run some of the four; the checks are those
of the settings that ran.
"""

from __future__ import annotations

import math
import statistics
import tomllib
from pathlib import Path
from typing import Any, Final

from rocev2_emu.experiments.harness import (
    G,
    Mode,
    check_lines,
    fabric_run,
    fabric_scenario,
    settings,
    topology_data,
)
from rocev2_emu.experiments.runs import Run
from rocev2_emu.fabric.agent import FlowSpec
from rocev2_emu.stats import percentile
from rocev2_emu.topology.generate import single_switch

SETTINGS: Final = {  # name: (PFC, DCQCN, NIC pacing: each sender at C/N)
    "lossy": (False, False, False),
    "pfc": (True, False, False),
    "pfc+dcqcn": (True, True, False),
    "pfc+pacing": (True, False, True),  # the seed's NIC pacing: each at C/N
}


def incast_fabric(mode: Mode, senders: int) -> tuple[dict[str, Any], list[str], str]:
    """The topology (parsed once: every setting's is a copy), the senders and the receiver: the
    scenario's one switch with ``senders + 1`` hosts, or ``mode.topology``'s first ``senders``
    hosts into its last."""
    text = single_switch(senders + 1) if mode.topology is None else Path(mode.topology).read_text()
    data = tomllib.loads(text)
    hosts = [h["name"] for h in data.get("host", [])]
    if len(hosts) < senders + 1:
        raise ValueError(
            f"{mode.topology}: {len(hosts)} hosts, too few for {senders} senders and a receiver"
        )
    return data, hosts[:senders], hosts[-1]


def buffer_bytes(data: dict[str, Any]) -> int:
    """2 MiB per switch, or more where a switch has many ports: each port takes 96 KiB of PFC
    headroom and 32 KiB of reserve, and the shared pool keeps at least 32 KiB a port."""
    ports: dict[str, int] = {}
    for link in data.get("link", []):
        for end in (link["a"], link["b"]):
            ports[end] = ports.get(end, 0) + 1
    return max(2 << 20, max(ports.values(), default=0) * 160 * 1024)


def qp_timeout(senders: int, size: int) -> int:
    """The QPs' ACK timeout exponent (4.096 us x 2^t): 10 for the canonical 8 senders, where
    it lets the lossy run recover quickly; at scale it must outlast twice the incast's own
    drain time (N x size / C), or every sender times out while it waits its turn."""
    drain = senders * size * 8 / (100 * G)
    if senders <= 8:
        return 10
    return max(10, min(31, math.ceil(math.log2(2 * drain / 4.096e-6))))


def incast(seed: int, mode: Mode = Mode()) -> tuple[list[Run], list[str], bool]:
    n = mode.senders or (4 if mode.processes else 8)
    size = mode.size or (1 << 20 if mode.processes else 4 << 20)
    if n < 1 or size < 1:
        raise ValueError(f"an incast needs --senders >= 1 and --size >= 1 (got {n}, {size})")
    chosen = mode.settings or tuple(SETTINGS)
    unknown = sorted(set(chosen) - set(SETTINGS))
    if unknown:
        raise ValueError(f"unknown incast settings {unknown} (known: {', '.join(SETTINGS)})")
    parsed, senders, receiver = incast_fabric(mode, n)
    buffer = {"size_bytes": buffer_bytes(parsed), "headroom_bytes": 96 * 1024}
    flows = [FlowSpec(i, src, receiver, size) for i, src in enumerate(senders)]
    runs: dict[str, Run] = {}
    lines: list[str] = []
    ok = True
    for setting in (s for s in SETTINGS if s in chosen):
        pfc, dcqcn, pacing = SETTINGS[setting]
        data = topology_data(
            parsed,
            seed,
            **settings(pfc, dcqcn, dcqcn),
            buffer=buffer,
            transport={
                "qp_timeout": qp_timeout(n, size),
                "max_inflight": 256,
                "pacing_gbps": 100.0 / n if pacing else 0.0,
            },
        )
        run = fabric_run(data, flows, receiver, 20e-6, setting, mode)
        runs[setting] = run
        fcts = sorted(r.fct for r in run.results if r.ok)
        fab = run.fabric
        drops = sum(fab["drops"].values())
        p99 = percentile(fcts, 0.99)
        lines.append(
            f"{setting:>10}: FCT p50 {statistics.median(fcts) * 1e6 if fcts else 0:.0f} us, "
            f"p99 {p99 * 1e6:.0f} us; drops {drops}, retransmitted {fab['retransmitted']}, "
            f"PFC frames {fab['pfc_tx']}, CNPs {fab['cnps_sent']}; all verified: "
            f"{len(fcts) == n}"
        )
        ok = ok and len(fcts) == n
    rtt = base_rtt(parsed, senders, receiver)
    long_flows = size * 8 / (100 * G) >= DCQCN_RTTS * rtt
    check, good = check_lines(_checks(runs, n, size, mode, long_flows))
    lines += check
    if not long_flows and "pfc" in runs and "pfc+dcqcn" in runs:
        lines.append(
            f"{'':>10}  not checked: DCQCN's fewer pauses; a flow lasts "
            f"{size * 8 / (100 * G) * 1e6:.1f} us at line rate, under {DCQCN_RTTS} base RTTs "
            f"({DCQCN_RTTS * rtt * 1e6:.0f} us): it ends before DCQCN can act"
        )
    ok = ok and good
    return list(runs.values()), lines, ok


DCQCN_RTTS: Final = 10  # a flow this many base RTTs long gives DCQCN time to act


def base_rtt(data: dict[str, Any], senders: list[str], receiver: str) -> float:
    """Twice the longest sender's propagation delay to the receiver (emulated seconds), over
    the topology's links (their delay, else the default's)."""
    default = data.get("link_defaults", {}).get("delay_us", 1.0) * 1e-6
    adj: dict[str, list[tuple[str, float]]] = {}
    for link in data.get("link", []):
        delay = link.get("delay_us", default * 1e6) * 1e-6
        adj.setdefault(link["a"], []).append((link["b"], delay))
        adj.setdefault(link["b"], []).append((link["a"], delay))
    far = {receiver: 0.0}
    frontier = [receiver]
    while frontier:  # breadth first: hop counts are what routes follow
        nxt = []
        for node in frontier:
            for peer, delay in adj.get(node, []):
                if peer not in far:
                    far[peer] = far[node] + delay
                    nxt.append(peer)
        frontier = nxt
    return 2 * max((far.get(s, 0.0) for s in senders), default=0.0)


def _checks(
    runs: dict[str, Run], n: int, size: int, mode: Mode, long_flows: bool
) -> list[tuple[str, bool]]:
    """The field's known results, for the settings that ran."""
    fab = {name: run.fabric for name, run in runs.items()}
    checks = []
    if "lossy" in fab:
        lossy = fab["lossy"]
        checks.append(
            (
                "without PFC the switch drops and go-back-N retransmits",
                sum(lossy["drops"].values()) > 0 and lossy["retransmitted"] > 0,
            )
        )
    if "pfc" in fab:
        pfc_only = fab["pfc"]
        checks.append(
            (
                "with PFC nothing is lost and the switch pauses",
                sum(pfc_only["drops"].values()) == 0 and pfc_only["pfc_tx"] > 0,
            )
        )
    if "pfc" in fab and "pfc+dcqcn" in fab and long_flows:
        both = fab["pfc+dcqcn"]
        checks.append(
            (
                "DCQCN sends CNPs and needs fewer pauses than PFC alone",
                both["cnps_sent"] > 0 and both["pfc_tx"] < fab["pfc"]["pfc_tx"],
            )
        )
    if "pfc+pacing" in fab:
        paced = fab["pfc+pacing"]
        ideal = n * size * 8 / (100 * G)  # the receiver's link, full, for everything
        slack = 0.2 if mode.processes else 0.1  # headers take 2 %; processes add their jitter
        checks.append(
            (
                f"NIC pacing at C/N: no pause, no drop, the last flow within {slack:.0%} of "
                f"the ideal {ideal * 1e6:.0f} us",
                paced["pfc_tx"] == 0
                and sum(paced["drops"].values()) == 0
                and max(r.fct for r in runs["pfc+pacing"].results) <= (1 + slack) * ideal,
            )
        )
    return checks


SCENARIO = fabric_scenario(
    "incast", incast, takes=frozenset({"senders", "size", "topology", "settings"})
)
