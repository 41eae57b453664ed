"""Instructions per frame-hop in virtual time, counted by valgrind's callgrind (not timed).

    .venv/bin/python benchmarks/hop_instructions.py [--cases a,b] [--top 25]

A machine too noisy for seconds still counts the same instructions for the same run: this
runs ``bench virtual``'s cases (:mod:`collectives.bench.virtual`) under ``valgrind
--tool=callgrind``, collecting only inside the event heap's ``run_until`` (the engine's work:
every core's receive, service and timers, and what their completions run; not the imports,
the fabric's set-up or trio's scheduler between runs), and prints the instructions per
frame-hop.  ``--top N`` adds the N functions with the most instructions of their own, per hop.
It needs the compiled cores (the function it collects in is the compiled heap's) and valgrind
(Debian's ``valgrind``).  About 70 x slower than the run itself.  Figures, not assertions
(docs/benchmarks.md, "Per frame-hop").
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

COLLECT = "CPyDef_events___EventHeap___run_until"  # the compiled heap's run_until


def _own(out: Path, top: int) -> list[tuple[int, str]]:
    """The ``top`` functions by their own instructions (callgrind_annotate's table)."""
    text = subprocess.run(
        ["callgrind_annotate", "--threshold=100", str(out)],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    rows = []
    for line in text.splitlines():
        m = re.match(r"\s*([\d,]+)\s+\([\s\d.]+%\)\s+(\S.*)$", line)
        if m and "PROGRAM TOTALS" not in line:
            name = re.sub(r"\s*\[.*\]$", "", m.group(2)).rsplit(":", 1)[-1]
            rows.append((int(m.group(1).replace(",", "")), name))
    return rows[:top]


def measure(case: str, top: int) -> dict[str, object]:
    """One case under callgrind: its frame-hops, instructions in the engine, and the top
    functions."""
    with tempfile.TemporaryDirectory(prefix="hop-instr-") as tmp:
        out = Path(tmp) / "callgrind.out"
        proc = subprocess.run(
            ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}",
             f"--toggle-collect={COLLECT}",
             sys.executable, "-m", "collectives.bench.virtual", case],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        if proc.returncode != 0:
            raise RuntimeError(f"case {case}: {proc.stderr.strip().splitlines()[-1:]}")
        hops = json.loads(proc.stdout.strip().splitlines()[-1])["hops"]
        m = re.search(r"Collected : (\d+)", proc.stderr)
        if m is None or int(m.group(1)) == 0:
            raise RuntimeError(f"case {case}: nothing collected in {COLLECT} (pure cores?)")
        return {"case": case, "hops": hops, "instructions": int(m.group(1)), "top": _own(out, top)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cases", default="a", help="comma-separated cases of bench virtual")
    p.add_argument("--top", type=int, default=0, help="functions with the most own instructions")
    args = p.parse_args()
    if shutil.which("valgrind") is None:
        print("valgrind is not installed (apt-get install valgrind)", file=sys.stderr)
        return 2
    print(f"# {'case':6} {'frame-hops':>11} {'instructions':>15} {'per hop':>9}")
    for case in args.cases.split(","):
        r = measure(case, args.top)
        hops, instr = int(r["hops"]), int(r["instructions"])  # type: ignore[call-overload]
        print(f"  {case:6} {hops:>11,} {instr:>15,} {instr / hops:>9,.0f}", flush=True)
        for own, name in r["top"]:  # type: ignore[attr-defined]
            print(f"      {own / hops:>8,.0f}  {name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
