"""Every metric a dashboard queries is one the nodes export, under that name and with the
labels the dashboard groups by: checked here against the real collectors of a virtual fabric
(the testbed test then checks, with a real Prometheus, that each expression returns data)."""

from __future__ import annotations

import re
import tomllib

import trio
import trio.testing
from prometheus_client import CollectorRegistry

from collectives.comm.metrics import HostCollectiveMetrics, StepMetrics
from rocev2_emu.fabric.virtual import virtual_fabric
from rocev2_emu.nic.metrics import nic_registry
from rocev2_emu.testbed import dashboards
from rocev2_emu.topology.file import parse
from rocev2_emu.topology.generate import leaf_spine
from switch.metrics import SwitchCollector

NAME = re.compile(r"\b(rocev2_[a-z_]+)")
GROUPED = re.compile(r"by \(([a-z_, ]+)\)")


async def test_every_dashboard_metric_is_exported_with_its_labels(
    autojump_clock: trio.testing.MockClock,
) -> None:
    topo = parse(tomllib.loads(leaf_spine(1, 1, 1)), "small.toml")
    async with virtual_fabric(topo) as (drivers, agents):
        host = nic_registry(agents["h0"].ctx.driver, "h0")
        HostCollectiveMetrics(host).rank(0).observe("all_reduce", 4096, 1e-5, 1.75)
        StepMetrics(host, 0).steps.inc()  # a PyTorch rank's (collectives.pytorch.worker)
        switch = CollectorRegistry()
        switch.register(SwitchCollector(drivers["leaf0"]))
        exported: dict[str, set[str]] = {}
        for registry in (host, switch):
            for family in registry.collect():
                # a family with no series yet (the per-QP DCQCN gauges of an idle NIC) still
                # names its labels
                labels = set(getattr(family, "_labelnames", ()))
                for sample in family.samples:
                    labels |= set(sample.labels)
                for suffix in ("", "_total", "_bucket", "_count", "_sum"):
                    exported.setdefault(family.name + suffix, set()).update(labels)
    assert all(
        "node" in labels
        for name, labels in exported.items()
        if "collective" not in name and "torch" not in name
    )
    missing = []
    for board in ("fabric", "transport", "collectives"):
        for expr in dashboards.expressions(dashboards.files()[f"dashboards/{board}.json"]):
            # a rate's divisor (the serving node's clock) is grouped on its own
            parts = [expr.replace(dashboards.CLOCK_RATE, "")]
            parts += [dashboards.CLOCK_RATE] if dashboards.CLOCK_RATE in expr else []
            for part in parts:
                labels = {g.strip() for group in GROUPED.findall(part) for g in group.split(",")}
                for name in NAME.findall(part):
                    if name not in exported:
                        missing.append(f"{board}: {name} (in {expr})")
                    # (Prometheus adds ``instance``, the scrape target, to every series it takes)
                    elif not labels <= exported[name] | {"le", "instance"}:
                        missing.append(f"{board}: {name} lacks {labels - exported[name]}")
    assert not missing, missing
