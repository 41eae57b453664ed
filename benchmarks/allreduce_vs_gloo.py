"""All-reduce busbw of rocev2-emu next to torch.distributed's Gloo backend, same machine, same run.

    python3 -m venv benchmarks/.venv
    benchmarks/.venv/bin/pip install -e . torch==2.13.0   # a CPU wheel on this machine
    benchmarks/.venv/bin/python benchmarks/allreduce_vs_gloo.py [--mib 16] [--ranks 4]

Gloo: ``--ranks`` processes on loopback (torch.multiprocessing), ``all_reduce`` of a float32
tensor of ``--mib`` MiB, 5 warm-up and ``--iters`` timed operations, the slowest rank's mean.
rocev2-emu: the same size and rank count as ``bench all-reduce`` with one process per node on a
single switch, at TDF 1 with unpaced links (rate 0), so both run as fast as the CPUs let them.
busbw = 2(n-1)/n x size / time for both (nccl-tests' definition).  Figures, not assertions:
torch is installed here only, never by the project.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
import tomllib
from pathlib import Path
from typing import Any


def _gloo_rank(rank: int, n: int, count: int, iters: int, port: int, out: Any) -> None:
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=n)
    x = torch.ones(count, dtype=torch.float32)
    for _ in range(5):
        dist.all_reduce(x)
    dist.barrier()
    start = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(x)
    out[rank] = (time.perf_counter() - start) / iters
    dist.destroy_process_group()


def gloo(n: int, nbytes: int, iters: int) -> float:
    import torch.multiprocessing as mp

    times = mp.Manager().dict()
    port = 29500 + os.getpid() % 1000
    mp.spawn(_gloo_rank, args=(n, nbytes // 4, iters, port, times), nprocs=n, join=True)
    return float(max(times.values()))


def emulator(n: int, nbytes: int, iters: int) -> float:
    from collectives.bench.nccl import params
    from collectives.jobs.launch import run_job
    from rocev2_emu.fabric.options import Clock, RunOptions
    from rocev2_emu.topology.file import parse
    from rocev2_emu.topology.generate import single_switch, to_toml

    data = tomllib.loads(single_switch(n, rate_gbps=0.0, tdf=1.0))
    # unpaced senders overrun the kernel's socket buffers; a window per QP keeps go-back-N
    # from resending thousands of packets at each loss
    data["transport"] = {"max_inflight": int(os.environ.get("WINDOW", 256))}
    path = Path(tempfile.mkdtemp(prefix="gloo-vs-emu-")) / "one-switch.toml"
    path.write_text(to_toml(data))
    job = params([nbytes], iters=iters, warmup=1, algo="ring", timeout=600.0, qp_timeout=14)
    wall = RunOptions(Clock.WALL, 1.0)
    results = run_job(parse(data, str(path)), str(path), "bench", job, wall).results
    failed = [v for v in results.values() if isinstance(v, dict)]
    assert not failed, failed
    rows = [results[r][0] for r in sorted(results)]
    assert all(row["outofplace"]["wrong"] == 0 for row in rows), "wrong values"
    return float(max(row["outofplace"]["time"] for row in rows))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--mib", type=int, default=16)
    ap.add_argument("--iters", type=int, default=5)
    args = ap.parse_args()
    n, size = args.ranks, args.mib << 20
    factor = 2 * (n - 1) / n
    t_gloo = gloo(n, size, max(args.iters, 20))
    t_emu = emulator(n, size, args.iters)
    for name, t in (("gloo (loopback TCP)", t_gloo), ("rocev2-emu (TDF 1, unpaced)", t_emu)):
        print(f"{name:>28}: {size / t / 1e9 * factor:8.3f} GB/s busbw ({t * 1e3:.1f} ms per op)")
    print(f"{'ratio':>28}: {t_gloo / t_emu:8.3f} (goal >= 0.25, issue #57)")


if __name__ == "__main__":
    main()
