"""The scale table: one all-reduce in virtual time on Meta-style AI zones of 64 to 24 576 ranks.

    .venv/bin/python benchmarks/scale.py [--ranks 64,512,4096,24576] [--bytes 65536]
        [--algo auto] [--payload real|none]

Each size is an AI zone of servers of 8 accelerators (2 per rack) with a NIC each, NVLink
inside the server (``rocev2-emu topology ai-zone``): 64 ranks are 2 zones x 2 racks, 512 are
2 x 16, 4 096 are 2 x 128, and 24 576 is the seed's cluster (8 zones x 192 racks, 18 CTSWs
and 18 ATSWs, 16 GiB CTSW buffers).  Every size runs in a fresh process (its peak memory is
its own): ``bench``'s job with one timed operation and no warm-up.  It prints, per size, the
wall time, the peak resident memory, the emulated time of the operation, the frame-hops and
frame-hops per wall second, and the wrong values (N/A with ``--payload none``).  Figures, not
assertions (docs/benchmarks.md, docs/fabric.md).
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path

SHAPES = {  # ranks -> the generator's flags (servers of 8, two a rack)
    64: ["--zones", "2", "--racks", "2"],
    512: ["--zones", "2", "--racks", "16"],
    4096: ["--zones", "2", "--racks", "128"],
    24576: ["--zones", "8", "--racks", "192", "--ctsws", "18", "--atsws", "18",
            "--ctsw-buffer-mb", "16384"],
}  # fmt: skip


def _one(path: str, nbytes: int, algo: str, payload: str) -> None:
    """In the child: the job, then a JSON line of what it measured."""
    from collectives.bench.nccl import params
    from collectives.jobs.job import run_virtual
    from rocev2_emu.topology.file import parse

    start = time.perf_counter()
    data = tomllib.loads(Path(path).read_text())
    data["fabric"]["payload"] = payload
    topo = parse(data, path)
    results, fabric = run_virtual(topo, "bench", params([nbytes], algo=algo, iters=1, warmup=0))
    wall = time.perf_counter() - start
    times = [r[0]["outofplace"]["time"] for r in results.values() if isinstance(r, list)]
    wrong = [r[0]["outofplace"]["wrong"] for r in results.values() if isinstance(r, list)]
    failed = len(results) - len(times)
    print(
        json.dumps(
            {
                "ranks": len(results),
                "wall_s": wall,
                "peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                "emulated_us": max(times) * 1e6 if times else None,
                "frame_hops": fabric["frame_hops"],
                "wrong": None if payload == "none" else sum(wrong),
                "failed_ranks": failed,
            }
        )
    )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", default="64,512,4096,24576", help="comma-separated sizes")
    p.add_argument("--bytes", type=int, default=65536, help="the all-reduce's size (64 KiB)")
    p.add_argument("--algo", default="auto", help="ring, hierarchical, tree or auto")
    p.add_argument("--payload", default="real", choices=["real", "none"])
    p.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        path, nbytes, algo, payload = args.child
        _one(path, int(nbytes), algo, payload)
        return 0
    print(f"# all-reduce of {args.bytes} B, algo {args.algo}, payload {args.payload}")
    print(f"{'ranks':>6} {'wall(s)':>9} {'peak(MiB)':>10} {'time(us)':>9} "
          f"{'frame-hops':>11} {'hops/s':>9} {'wrong':>6}")  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="scale-") as tmp:
        for ranks in (int(r) for r in args.ranks.split(",")):
            flags = SHAPES[ranks] + ["--servers-per-rack", "2", "--accelerators", "8"]
            text = subprocess.run(
                [sys.executable, "-m", "rocev2_emu", "topology", "ai-zone", *flags],
                capture_output=True, text=True, check=True,
            ).stdout  # fmt: skip
            path = Path(tmp) / f"zone{ranks}.toml"
            path.write_text(text)
            child = [sys.executable, __file__, "--child", str(path), str(args.bytes), args.algo]
            done = subprocess.run(
                [*child, args.payload], capture_output=True, text=True, check=False
            )
            if done.returncode != 0:
                print(f"{ranks:>6} failed: {done.stderr.strip().splitlines()[-1:]}")
                continue
            r = json.loads(done.stdout.strip().splitlines()[-1])
            wrong = "N/A" if r["wrong"] is None else str(r["wrong"])
            print(
                f"{r['ranks']:>6} {r['wall_s']:>9.1f} {r['peak_mib']:>10.0f} "
                f"{r['emulated_us']:>9.2f} {r['frame_hops']:>11} "
                f"{r['frame_hops'] / r['wall_s']:>9.0f} {wrong:>6}",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
