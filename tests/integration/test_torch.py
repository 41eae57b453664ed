"""The rocev2 torch.distributed backend, with processes: ``rocev2-emu launch`` over a leaf-spine
of switch processes, three ranks (two under one leaf, one across the spines), at TDF 1000.

* every operation against Gloo's result, for every supported dtype and sizes 0, 1, 7 and 1031
  (tests/integration/torch_ops.py), and the clear errors for what is not supported;
* DDP and FSDP2 train examples/ddp_train.py over the fabric and over Gloo from the same seed,
  and the parameters agree within float32 tolerance;
* a killed rank makes the others raise at once, naming the rank, the operation and its number,
  and ``launch`` exits with the killed rank's code;
* on the exact clock (``launch --clock exact``) four DDP ranks report the same emulated
  communication, collective by collective, on every run - one of them beside two CPU burners,
  one with a launcher per host (``launch --host NAME --clock exact``) and a node process per
  switch joining the first host's coordinator - and train as over Gloo; a rank that dies there
  stops the job in one line naming it.

torch is the ``torch`` extra: under CI=true a missing torch fails these tests.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from rocev2_emu.control import auth
from rocev2_emu.topology.file import load
from rocev2_emu.topology.generate import leaf_spine
from tests.integration.hangs import run_or_dump
from tests.integration.test_exact import cpu_burners

# a launch that hangs fails at LAUNCH_SECONDS with every process's stacks (tests/integration/
# hangs.py), within the test's own deadline even for the tests that launch several times
pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]
LAUNCH_SECONDS = 100
ROOT = Path(__file__).resolve().parents[2]

if os.environ.get("CI") == "true":
    import torch  # noqa: F401 - CI installs the torch extra: its absence is a failure
else:
    pytest.importorskip("torch", reason="pip install -e '.[torch]'")


@pytest.fixture(scope="module")
def topology(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("torch") / "leaf-spine.toml"
    path.write_text(leaf_spine(2, 2, 2, tdf=1000))
    return path


def launch(
    topology: Path,
    program: list[str],
    env: dict[str, str] | None = None,
    ranks: int = 3,
    options: tuple[str, ...] = (),
) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "rocev2_emu", "launch", str(topology), "--ranks", str(ranks)]
    cmd += (
        options if "--clock" in options else ("--clock", "wall", *options)
    )  # (the default: exact)
    return run_or_dump(
        [*cmd, "--", sys.executable, "-W", "ignore", *program],
        LAUNCH_SECONDS,
        env={**os.environ, **(env or {})},
        cwd=ROOT,
    )


def launch_gloo(
    topology: Path, program: list[str], ranks: int = 3, options: tuple[str, ...] = ()
) -> subprocess.CompletedProcess[str]:
    """The Gloo reference run of ``program``, again once if torch's Gloo aborted a rank as
    it exited: the reference, not what is tested.  DDP keeps a Gloo group (and its C++
    worker threads) alive past ``destroy_process_group`` into interpreter teardown, where a
    thread still joinable can std::terminate the rank (pytorch/pytorch #190489, #179291; seen
    in CI with FSDP2 and DDP, after every step had run)."""
    run = launch(topology, program, ranks=ranks, options=options)
    if _gloo_aborted(run):
        run = launch(topology, program, ranks=ranks, options=options)
    return run


@pytest.fixture(scope="module")
def op_results(topology: Path, tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    out = tmp_path_factory.mktemp("torch-ops")
    run = launch(topology, [str(ROOT / "tests/integration/torch_ops.py")], {"OUT": str(out)})
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(3)]


def test_every_op_dtype_and_awkward_size_matches_gloo(op_results: list[dict[str, Any]]) -> None:
    for rank, result in enumerate(op_results):
        assert result["wrong"] == [], (rank, result["wrong"][:5])
        # 6 dtypes x 4 sizes x (4 reductions + AVG + 12 operations + strided) on every rank
        assert result["checked"] >= 6 * 4 * 17, result["checked"]
        assert result["ops"] > 0  # step() saw the operations
        # and exported them: the host's /metrics serves the step's communication
        assert result["scraped"] == pytest.approx(result["communication"]) and result["scraped"] > 0


def test_unsupported_inputs_give_clear_errors(op_results: list[dict[str, Any]]) -> None:
    errors = op_results[0]["errors"]
    assert "meta tensor" in errors["meta device"] and "CPU tensors" in errors["meta device"]
    assert (
        errors["uint8"].startswith("TypeError")
        and "torch.uint8 is not supported" in errors["uint8"]
    )
    assert "torch.bool is not supported" in errors["bool"]
    assert "reduce op BAND is not supported" in errors["BAND"]
    assert "only dense tensors" in errors["sparse"]
    assert "any source is not supported" in errors["recv any source"]
    assert "root 8 is no rank" in errors["bad root"]


def _gloo_aborted(run: subprocess.CompletedProcess[str]) -> bool:
    """A rank of a Gloo run died of SIGABRT with std::terminate's message."""
    return run.returncode != 0 and "terminate called without an active exception" in (
        run.stdout + run.stderr
    )


@pytest.mark.parametrize("how", ["ddp", "fsdp"])
def test_training_is_the_same_as_over_gloo(topology: Path, tmp_path: Path, how: str) -> None:
    """DDP (buckets of all-reduces) or FSDP2 (all-gathers and reduce-scatters), same seed."""
    import torch

    params = {}
    for backend in ("rocev2", "gloo"):
        save = tmp_path / f"{backend}.pt"
        argv = [
            "examples/ddp_train.py",
            "--steps",
            "4",
            "--width",
            "64",
            "--backend",
            backend,
            "--bucket-mb",
            "0.01",
            "--save",
            str(save),
            *(["--fsdp"] if how == "fsdp" else []),
        ]
        run = launch_gloo(topology, argv) if backend == "gloo" else launch(topology, argv)
        assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
        steps = [
            line.split() for line in run.stdout.splitlines() if re.match(r"\[rank0\]: +\d+ ", line)
        ]
        assert [int(s[1]) for s in steps] == [0, 1, 2, 3], run.stdout[-2000:]
        if backend == "rocev2":  # DDP's buckets, FSDP's per-layer gathers: several per step
            assert all(int(s[4]) >= 2 for s in steps[1:]), steps
        params[backend] = torch.load(save)
    ours, theirs = params["rocev2"], params["gloo"]
    assert ours.keys() == theirs.keys()
    for name in ours:
        torch.testing.assert_close(ours[name], theirs[name], rtol=1e-5, atol=1e-6)
    # and training moved them: the comparison is not of two initial states
    torch.manual_seed(0)
    first = torch.nn.Linear(32, 64).weight
    assert not torch.allclose(ours["0.weight"], first)


def test_the_recommendation_example_trains_as_over_gloo(topology: Path, tmp_path: Path) -> None:
    """examples/dlrm_train.py: sharded embedding tables behind all_to_all_single (its backward
    the gradients' all-to-all), DDP on the dense part; the same losses and parameters as over
    Gloo from the same seed, and the fabric time split per step."""
    import torch

    params, losses = {}, {}
    for backend in ("rocev2", "gloo"):
        save = tmp_path / f"dlrm-{backend}.pt"
        argv = ["examples/dlrm_train.py", "--steps", "3", "--backend", backend, "--save", str(save)]
        run = launch_gloo(topology, argv) if backend == "gloo" else launch(topology, argv)
        assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
        steps = [
            line.split() for line in run.stdout.splitlines() if re.match(r"\[rank0\]: +\d+ ", line)
        ]
        assert [int(s[1]) for s in steps] == [0, 1, 2], run.stdout[-2000:]
        losses[backend] = [float(s[2]) for s in steps]
        if backend == "rocev2":  # both all-to-alls and DDP's all-reduce took fabric time
            assert all(float(s[3]) > 0 and float(s[4]) > 0 for s in steps), steps
        params[backend] = torch.load(save)
    assert losses["rocev2"] == losses["gloo"]
    ours, theirs = params["rocev2"], params["gloo"]
    assert ours.keys() == theirs.keys() and any(k.startswith("shard.") for k in ours)
    for name in ours:
        torch.testing.assert_close(ours[name], theirs[name], rtol=1e-5, atol=1e-6)


KILLED = textwrap.dedent(
    """
    import os, signal, torch, torch.distributed as dist
    dist.init_process_group("rocev2")
    t = torch.ones(1000)
    dist.all_reduce(t)
    if dist.get_rank() == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    for _ in range(3):
        dist.all_reduce(t)
    """
)


def test_a_killed_rank_raises_in_the_others(topology: Path, tmp_path: Path) -> None:
    script = tmp_path / "killed.py"
    script.write_text(KILLED)
    run = launch(topology, [str(script)])
    assert run.returncode == 128 + 9, run.stdout[-2000:] + run.stderr[-2000:]
    assert "rank 1 (h1) exited with code -9" in run.stderr
    for rank in (0, 2):
        lines = [line for line in run.stderr.splitlines() if line.startswith(f"[rank{rank}]:")]
        text = "\n".join(lines)
        # the abort reached its collective (in flight, or the next): rank, operation, number
        named = rf"rank {rank}: all_reduce #\d+(?: failed)?: (?:job )?aborted: rank 1 \(h1\) exited"
        assert re.search(named, text), text[-2000:]


def _ddp(topology: Path, out: Path, backend: str, clock: str) -> subprocess.CompletedProcess[str]:
    out.mkdir()
    program = ["examples/ddp_train.py", "--steps", "3", "--width", "64", "--bucket-mb", "0.01"]
    program += ["--backend", backend, "--save", str(out / "params.pt")]
    program += ["--report", str(out)] if backend == "rocev2" else []
    options = ("--clock", clock, "--compute-ms", "5")
    run = launch_gloo if backend == "gloo" else launch
    return run(topology, program, ranks=4, options=options)


def _ddp_per_host(topology: Path, out: Path) -> list[str]:
    """The exact DDP run of :func:`_ddp` as the compose testbed's training service would
    start it: a ``launch --host NAME --clock exact`` per host (the first serving the run's
    coordinator) and a ``node NAME --clock exact --sync`` per switch, in no particular order,
    sharing one fabric secret; each process's output, after every one has ended."""
    out.mkdir()
    topo = load(topology)
    sync = f"{topo.nodes['h0'].address}:29600"
    env = {**os.environ, auth.ENV: secrets.token_hex(auth.SECRET_BYTES), "PYTHONFAULTHANDLER": "1"}
    program = ["examples/ddp_train.py", "--steps", "3", "--width", "64", "--bucket-mb", "0.01"]
    program += ["--backend", "rocev2", "--report", str(out)]
    exe = [sys.executable, "-m", "rocev2_emu"]
    node = ["--clock", "exact", "--sync", sync, "--join-timeout", "300", "--no-metrics"]
    rank = ["--ranks", "4", "--clock", "exact", "--compute-ms", "5", "--", sys.executable]
    argvs = [[*exe, "node", str(topology), name, *node] for name in ("spine0", "spine1")]
    argvs += [
        [*exe, "launch", str(topology), "--host", host, *rank, "-W", "ignore", *program]
        for host in ("h3", "h1", "h0", "h2")
    ]
    argvs += [[*exe, "node", str(topology), name, *node] for name in ("leaf0", "leaf1")]
    logs = [out / f"process{n}.log" for n in range(len(argvs))]
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for argv, log in zip(argvs, logs, strict=True):
            with log.open("wb") as f:
                procs.append(
                    subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
                )
        deadline = time.monotonic() + LAUNCH_SECONDS
        try:
            codes = [proc.wait(timeout=max(0.1, deadline - time.monotonic())) for proc in procs]
        except subprocess.TimeoutExpired:  # hung: each process's stacks into its log, shown
            for proc in procs:
                proc.send_signal(signal.SIGABRT)
            codes = [proc.wait(timeout=15) for proc in procs]
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
    texts = [log.read_text() for log in logs]
    assert codes == [0] * len(argvs), "\n".join(
        f"{' '.join(argv[3:6])}: exit {code}\n{text[-1500:]}"
        for argv, code, text in zip(argvs, codes, texts, strict=True)
    )
    return texts


def test_exact_ddp_reports_the_same_communication_on_every_run_loaded_or_not(
    topology: Path, tmp_path: Path
) -> None:
    """Four DDP ranks on the exact clock, twice (the second beside two CPU burners) and once
    with a launcher per host: every rank's step reports - each collective's emulated seconds -
    byte for byte the same; the parameters as over Gloo."""
    import torch

    runs = []
    for n in range(2):
        with cpu_burners(2 if n else 0):
            run = _ddp(topology, tmp_path / f"exact{n}", "rocev2", "exact")
        assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
        assert "clock: exact" in run.stdout, run.stdout[-1000:]
        runs.append([(tmp_path / f"exact{n}" / f"rank{r}.json").read_text() for r in range(4)])
    assert runs[0] == runs[1]
    outputs = _ddp_per_host(topology, tmp_path / "per-host")
    first = outputs[4]  # h0's launcher: the coordinator's, with the fabric's counters
    assert "rank 0 of 4 on leaf-spine, clock: exact, coordinator on" in first, first[-2000:]
    assert re.search(r"# fabric: .* \d+ frame-hops; clock: exact", first), first[-2000:]
    split = [(tmp_path / "per-host" / f"rank{r}.json").read_text() for r in range(4)]
    assert split == runs[0]
    for text in runs[0]:
        steps = json.loads(text)
        assert len(steps) == 3 and all(len(s["ops"]) >= 2 for s in steps), steps
        assert all(s["communication"] > 0 for s in steps)
        assert all(s["communication"] == sum(op[2] for op in s["ops"]) for s in steps)
    gloo = _ddp(topology, tmp_path / "gloo", "gloo", "wall")
    assert gloo.returncode == 0, gloo.stdout[-3000:] + gloo.stderr[-3000:]
    ours, theirs = (torch.load(tmp_path / d / "params.pt") for d in ("exact0", "gloo"))
    for name in ours:
        torch.testing.assert_close(ours[name], theirs[name], rtol=1e-5, atol=1e-6)


def test_a_rank_that_dies_on_the_exact_clock_stops_the_job_naming_it(
    topology: Path, tmp_path: Path
) -> None:
    script = tmp_path / "die.py"
    script.write_text(
        textwrap.dedent(
            """
            import os, torch, torch.distributed as dist
            import collectives.pytorch
            dist.init_process_group("rocev2")
            t = torch.ones(1000)
            dist.all_reduce(t)
            if dist.get_rank() == 1:
                os._exit(3)
            dist.all_reduce(t)
            dist.destroy_process_group()
            """
        )
    )
    run = launch(topology, [str(script)], options=("--clock", "exact"))
    assert run.returncode == 3, run.stdout[-3000:] + run.stderr[-3000:]
    assert "rank 1 (h1) exited with code 3" in run.stderr, run.stderr
