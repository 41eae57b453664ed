"""The harness of the congestion scenarios: run flows on a scenario's fabric, sample it, check
it, and write what it found.

A scenario builds its topology (:func:`topology_data`, :func:`scenario_topology`,
:func:`settings` for PFC / ECN / DCQCN), runs its flows with :func:`fabric_run` - in virtual time
with every flow's goodput, the watched port's queue, marks and pauses sampled
(:mod:`~rocev2_emu.experiments.sampled`), or
as one process per node at a TDF (flow results and counters only) - and returns an
:class:`Outcome`: its runs, report lines, checks and plot.  :func:`main` prints the report,
writes ``NAME.json`` (and ``NAME.png`` when matplotlib is installed) and gives the exit code.
Scenarios register by name in :data:`SCENARIOS` (:mod:`rocev2_emu.experiments.catalog` holds
the built-in ones; plugins add theirs).
"""

from __future__ import annotations

import copy
import json
import statistics
import sys
import tempfile
import tomllib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Final, Protocol

from prometheus_client import CollectorRegistry

from rocev2_emu.experiments.plots import plot_runs
from rocev2_emu.experiments.runs import Run, runs_json
from rocev2_emu.experiments.sampled import START, run_sampled
from rocev2_emu.experiments.sampled import G as G  # the scenarios take it from here
from rocev2_emu.fabric.agent import FlowSpec
from rocev2_emu.fabric.flow_run import run_flow_job
from rocev2_emu.fabric.options import Clock, RunOptions
from rocev2_emu.fabric.virtual import Watcher
from rocev2_emu.topology.file import parse
from rocev2_emu.topology.generate import to_toml
from rocev2_emu.topology.model import Topology

SCENARIO_TDF = 1000.0  # a scenario's wall clock: 1 000 wall seconds per emulated second
VIRTUAL: Final = RunOptions(Clock.VIRTUAL)  # a scenario's default: one process, virtual time


def topology_data(
    base: str | dict[str, Any], seed: int, **sections: dict[str, Any]
) -> dict[str, Any]:
    """A scenario run's topology: ``base`` (a topology file's text, or its data already parsed,
    copied here) with the seed and ``sections``' values set."""
    data = tomllib.loads(base) if isinstance(base, str) else copy.deepcopy(base)
    data["fabric"]["seed"] = seed
    for name, values in sections.items():
        data.setdefault(name, {}).update(values)
    return data


def with_payload_data(data: dict[str, Any], payload: str | None) -> dict[str, Any]:
    """A scenario run's topology ``data`` with the mode's ``--payload`` in its [fabric], if
    given (a copy; ``data`` is left as it was)."""
    if payload is None:
        return data
    return {**data, "fabric": {**data["fabric"], "payload": payload}}


def fabric_run(
    data: dict[str, Any],
    flows: list[FlowSpec],
    watch: tuple[str, int] | str,
    dt: float,
    setting: str,
    mode: Mode,
) -> Run:
    """Run ``flows`` on the topology ``data``: in virtual time with sampled series, or as one
    process per node on the mode's clock (flow results and counters only).  ``watch``: the
    (switch, port) to sample, or a host: the switch port facing it."""
    data = with_payload_data(data, mode.run.payload)
    if not mode.processes:
        topo = parse(data, "<scenario>")
        recorder = mode.record(topo, setting) if mode.record else None
        return run_sampled(topo, flows, watch, dt, setting, recorder)
    data = {**data, "fabric": {**data["fabric"], "tdf": mode.tdf}}
    with tempfile.TemporaryDirectory() as tmp:
        path = f"{tmp}/{setting}.toml"
        Path(path).write_text(to_toml(data))
        topo = parse(data, path)
        beside = mode.ui(topo) if mode.ui else None
        run = run_flow_job(topo, path, flows, mode.run, t0=START, beside=beside)
    return Run(setting, run.results, fabric=run.fabric)


class Recorder(Protocol):
    """Makes the map's recorder of one virtual run of ``topo`` under ``setting``; ``registry``:
    the metrics of the run's collective job, for the ranks' progress (None: a flow run)."""

    def __call__(
        self, topo: Topology, setting: str, registry: CollectorRegistry | None = None
    ) -> Watcher: ...


@dataclass(slots=True, frozen=True)
class Mode:
    """How a scenario runs: its ``run`` options (the clock: virtual time by default; a wall
    clock dilated by :data:`SCENARIO_TDF` unless given); and, for scenarios that take them
    (:attr:`Scenario.takes`), its scale: ``senders``, bytes per flow or per operation
    (``size``), a ``topology`` file to run on, which ``settings`` to run, a job's
    ``iterations``, and a workload's ``flows``, ``loads`` and ``cdf``."""

    run: RunOptions = VIRTUAL
    senders: int | None = None
    size: int | None = None
    topology: str | None = None
    settings: tuple[str, ...] | None = None
    iterations: int | None = None
    flows: int | None = None  # flows a run (fct)
    loads: tuple[float, ...] | None = None  # fractions of the hosts' line rate (fct)
    cdf: str | None = None  # a flow-size distribution, shipped or a file (fct)
    # the map: a recorder of each virtual run (by topology and setting), a live server beside
    # each run with processes (given by the CLI: this layer does not import the ui)
    record: Recorder | None = None
    ui: Callable[[Topology], Callable[..., Awaitable[None]]] | None = None

    @property
    def processes(self) -> bool:
        """Its runs have node processes (exact or wall clock), not one event engine."""
        return self.run.clock is not Clock.VIRTUAL

    @property
    def tdf(self) -> float:
        """The wall clock's dilation of a run with processes."""
        return self.run.tdf or SCENARIO_TDF


def settings(
    pfc: bool, dcqcn: bool, ecn: bool, profile: str = "paper"
) -> dict[str, dict[str, Any]]:
    # With DCQCN, mark as the DCQCN paper does (Kmin 5 KB, Kmax 200 KB, Pmax 1 %): well below
    # where PFC engages, so rates are cut before the switch has to pause anyone.
    marking = {"kmin_kb": 5, "kmax_kb": 200, "pmax": 0.01}
    return {
        "pfc": {"enabled": pfc},
        "dcqcn": {"enabled": dcqcn, "profile": profile},
        "ecn": {"enabled": ecn, "priorities": [3], **marking},
    }


def scenario_topology(
    name: str,
    switches: list[str],
    links: list[tuple[str, str]],
    uplink_gbps: float = 100.0,
    rate_gbps: float = 100.0,
) -> str:
    """A scenario topology: 1 us links at ``rate_gbps``, or ``uplink_gbps`` between
    switches; hosts are the link ends that are not switches."""
    hosts = sorted({end for link in links for end in link} - set(switches))
    lines = [f'[fabric]\nname = "{name}"\nmtu = 4096\n[link_defaults]\nrate_gbps = {rate_gbps}']
    lines += ["delay_us = 1.0"] + [f'[[switch]]\nname = "{n}"' for n in switches]
    lines += [f'[[host]]\nname = "{n}"' for n in hosts]
    for a, b in links:
        lines.append(f'[[link]]\na = "{a}"\nb = "{b}"')
        if a in switches and b in switches:
            lines.append(f"rate_gbps = {uplink_gbps:.1f}")
    return "\n".join(lines) + "\n"


def jain(values: list[float]) -> float:
    """Jain's fairness index: 1 when all are equal, 1/n when one takes everything."""
    return sum(values) ** 2 / (len(values) * sum(v * v for v in values)) if any(values) else 0.0


def steady_shares(run: Run) -> list[float]:
    """Mean goodput of each flow while all of them were running (the middle 80 %)."""
    first_done = min(r.start + r.fct for r in run.results)
    picks = [k for k, t in enumerate(run.times) if 0.1 * first_done <= t <= 0.9 * first_done]
    return [statistics.fmean(run.goodput[f][k] for k in picks) for f in sorted(run.goodput)]


Check = tuple[str, bool]
Rows = tuple[list[dict[str, Any]], list[str], bool]  # a job scenario's rows, report, verdict


def check_lines(checks: list[Check]) -> tuple[list[str], bool]:
    """One report line per check, and whether all passed."""
    lines, ok = [], True
    for text, good in checks:
        lines.append(f"{'':>10}  check: {text}: {'pass' if good else 'FAIL'}")
        ok = ok and good
    return lines, ok


@dataclass(frozen=True, slots=True)
class Outcome:
    """What a scenario found: its runs as NAME.json holds them, its report, its verdict, and
    how to draw NAME.png (``plot(path)`` is False when it could not: no matplotlib)."""

    runs: list[dict[str, Any]]
    lines: list[str]
    ok: bool
    plot: Callable[[Path], bool] | None = None
    no_plot: str = "matplotlib absent"


@dataclass(frozen=True, slots=True)
class Scenario:
    name: str
    run: Callable[[int, Mode], Outcome]
    virtual_only: bool = False
    units: str = "; rates in emulated Gbit/s"
    takes: frozenset[str] = frozenset()  # the Mode fields of scale it accepts
    exact: bool = False  # its runs with processes can run on the exact clock (--clock exact)
    not_exact: str = ""  # why they cannot, when not (--clock exact is refused saying so)


SCENARIOS: dict[str, Scenario] = {}


def fabric_scenario(
    name: str,
    experiment: Callable[[int, Mode], tuple[list[Run], list[str], bool]],
    takes: frozenset[str] = frozenset(),
    exact: bool = True,
) -> Scenario:
    """A scenario of fabric runs: their JSON, report and verdict, and the plot of the runs that
    kept time series (virtual ones; runs with processes keep none).  ``exact``: its runs with
    processes may run on the exact clock (the dilation scenario's may not: it measures the
    wall clock's)."""

    def run(seed: int, mode: Mode) -> Outcome:
        runs, lines, ok = experiment(seed, mode)
        series = [r for r in runs if r.times]
        return Outcome(
            runs_json(runs),
            lines,
            ok,
            partial(plot_runs, name, series) if series else None,
            "matplotlib absent" if series else "processes keep no time series",
        )

    not_exact = "" if exact else "it measures the wall clock's dilation"
    return Scenario(name, run, takes=takes, exact=exact, not_exact=not_exact)


def job_scenario(
    name: str,
    experiment: Callable[[int, float | None, Mode], Rows],
    plot: Callable[[list[dict[str, Any]], Path], bool],
    *,
    takes: frozenset[str] = frozenset(),
    virtual_only: bool = False,
) -> Scenario:
    """A scenario of collective jobs, in virtual time or with processes at the mode's TDF or on
    the exact clock (``experiment(seed, tdf, mode)``, ``tdf`` None in virtual time; the mode's
    recorder or live map beside each job); it plots its own rows.  ``takes``: the Mode fields
    of scale it accepts; ``virtual_only``: its jobs run in virtual time only (the mode's clock
    is refused otherwise)."""

    def run(seed: int, mode: Mode) -> Outcome:
        rows, lines, ok = experiment(seed, mode.tdf if mode.processes else None, mode)
        return Outcome(rows, lines, ok, partial(plot, rows))

    return Scenario(
        name, run, virtual_only=virtual_only, units="", takes=takes, exact=not virtual_only
    )


SCALE = ("senders", "size", "topology", "settings", "iterations", "flows", "loads", "cdf")
SCALE_FLAGS = {
    "senders": "--senders",
    "size": "--size",
    "topology": "--topology",
    "iterations": "--iterations",
    "loads": "--load",
}


def register(scenario: Scenario) -> Scenario:
    SCENARIOS[scenario.name] = scenario
    return scenario


def main_seeds(name: str, *, seed: int, seeds: int, out: str | None, **kw: Any) -> int:
    """Scenario ``name`` for ``seeds`` seeds from ``seed`` (each into ``out/seed-K``), then how
    many seeds each check passed in: a conclusion should not hang on one seed."""
    reports: dict[int, list[str]] = {}
    worst = 0
    for k in range(seed, seed + seeds):
        where = str(Path(out or ".") / f"seed-{k}")
        rc = main(name, seed=k, out=where, **kw)
        if rc == 2:
            return rc  # refused before running: the same for every seed
        worst = max(worst, rc)
        data = json.loads((Path(where) / f"{name}.json").read_text())
        reports[k] = [line.strip() for line in data["report"] if "check:" in line]
    print(f"# {name} over seeds {seed} to {seed + seeds - 1}:")
    for i in range(max(len(r) for r in reports.values())):
        lines = {k: r[i] for k, r in reports.items() if i < len(r)}
        passed = [k for k, line in lines.items() if line.endswith(": pass")]
        first = next(iter(lines.values())).removeprefix("check: ").rsplit(": ", 1)[0]
        failed = ", ".join(f"seed {k}" for k in lines if k not in passed)
        print(
            f"#   check {i + 1} ({first}, seed {seed}'s figures): passed with "
            f"{len(passed)} of {len(lines)} seeds" + (f"; failed with {failed}" if failed else "")
        )
    return worst


def main(
    name: str,
    *,
    seed: int,
    out: str | None,
    options: RunOptions,
    scale: dict[str, Any] | None = None,
    record: Recorder | None = None,
    ui: Callable[[Topology], Callable[..., Awaitable[None]]] | None = None,
) -> int:
    """Run scenario ``name`` with the run's ``options``; ``scale``: the Mode fields of scale
    given (senders, size, topology, settings, iterations), each refused by a scenario that does
    not take it; ``record``, ``ui``: the map's recorder (virtual) and live server (processes),
    per run."""
    scenario = SCENARIOS.get(name)
    if scenario is None:
        print(f"unknown scenario {name!r}; built: {sorted(SCENARIOS)}", file=sys.stderr)
        return 2
    clock = options.clock
    if scenario.virtual_only and clock is not Clock.VIRTUAL:
        print(f"{name} runs in virtual time only: add --virtual", file=sys.stderr)
        return 2
    if clock is Clock.EXACT and not scenario.exact:
        print(f"{name} takes no --clock exact: {scenario.not_exact}", file=sys.stderr)
        return 2
    given = {k: v for k, v in (scale or {}).items() if v is not None}
    refused = sorted(set(given) - scenario.takes)
    if refused:
        flags = ", ".join(SCALE_FLAGS.get(k, "--" + k) for k in refused)
        print(f"scenario {name} takes no {flags}", file=sys.stderr)
        return 2
    mode = Mode(options, **given, record=record, ui=ui)
    where = {
        Clock.VIRTUAL: "virtual time (TDF 1)",
        Clock.WALL: f"one process per node, clock: wall, TDF {mode.tdf:g}",
        Clock.EXACT: "one process per node"
        if options.workers is None
        else f"{options.workers} worker processes",
    }[clock]
    if clock is Clock.EXACT:
        where += ", clock: exact"
    if options.payload == "none":
        where += ", payload: none (timing only: values not checked)"
    print(f"# scenario {name}, {where}, seed {seed}{scenario.units}", flush=True)
    outcome = scenario.run(seed, mode)
    for line in outcome.lines:
        print(line)
    out_dir = Path(out or ".")
    out_dir.mkdir(parents=True, exist_ok=True)
    data = {
        "scenario": name,
        "seed": seed,
        "ok": outcome.ok,
        "report": outcome.lines,
        "runs": outcome.runs,
    }
    (out_dir / f"{name}.json").write_text(json.dumps(data, indent=1))
    png = out_dir / f"{name}.png"
    plotted = outcome.plot is not None and outcome.plot(png)
    print(
        f"# wrote {out_dir / (name + '.json')}"
        + (f" and {png}" if plotted else f" (no plot: {outcome.no_plot})")
    )
    return 0 if outcome.ok else 1
