"""Seeded virtual runs whose JSON the two builds of the cores must print byte for byte
(tests/integration/test_cores_build.py): ``python -m tests.integration.cores_runs``.

The incast scenario's four settings (its checks must pass); a 15 -> 1 incast on a k = 4
fat-tree with PFC, ECN and DCQCN; the same with two lossy links (go-back-N recovery); an
8-rank ring all-reduce on the leaf-spine.
"""

from __future__ import annotations

import contextlib
import io
import json
import sys
import tempfile
import tomllib
from dataclasses import asdict
from pathlib import Path
from typing import Any

from collectives.bench.virtual import all_reduce_once
from collectives.jobs.job import run_virtual
from rocev2_emu import cores
from rocev2_emu.experiments import catalog, harness
from rocev2_emu.experiments.harness import VIRTUAL
from rocev2_emu.fabric.agent import FlowSpec
from rocev2_emu.fabric.virtual import run_flows_virtual
from rocev2_emu.topology.file import parse
from rocev2_emu.topology.generate import fat_tree, leaf_spine


def _incast(loss: float) -> dict[str, Any]:
    data = tomllib.loads(fat_tree(4))
    for link in data["link"][:2]:  # the faults' seeded draws count too
        link["loss"] = loss
    topo = parse(data, "ft4.toml")
    hosts = [h.name for h in topo.hosts]
    flows = [FlowSpec(i, src, hosts[-1], 64 << 10) for i, src in enumerate(hosts[:-1])]
    results, fabric = run_flows_virtual(topo, flows)
    return {"results": [asdict(r) for r in results], "fabric": fabric}


def _all_reduce() -> dict[str, Any]:
    assert all_reduce_once is not None  # registered as the job "all-reduce-once"
    topo = parse(tomllib.loads(leaf_spine(2, 4, 2)), "leaf-spine.toml")
    results, fabric = run_virtual(topo, "all-reduce-once", {"bytes": 1 << 20})
    return {"results": results, "fabric": fabric}


def _scenario_incast() -> Any:
    """The incast scenario's four settings (lossy, PFC, PFC + DCQCN, PFC + NIC pacing)."""
    assert "incast" in catalog.SCENARIOS  # the catalog registers the scenarios
    with tempfile.TemporaryDirectory() as out, contextlib.redirect_stdout(io.StringIO()):
        scale = {"senders": 4, "size": 256 << 10}
        code = harness.main("incast", seed=3, out=out, options=VIRTUAL, scale=scale, record=None)
        if code != 0:
            raise AssertionError(f"scenario incast exited {code}")
        return json.loads((Path(out) / "incast.json").read_text())


def main() -> int:
    runs = {
        "scenario_incast": _scenario_incast(),
        "build": cores.BUILD,
        "incast": _incast(0.0),
        "faulty": _incast(0.02),
        "all_reduce": _all_reduce(),
    }
    print(json.dumps(runs, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
