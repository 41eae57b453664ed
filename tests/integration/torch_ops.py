"""A rank program for tests/integration/test_torch.py: every operation of the rocev2 backend
against Gloo's result (a Gloo group over the same ranks), for every supported dtype and awkward
sizes, then the clear errors for what is not supported.  Run by ``rocev2-emu launch``; each rank
writes ``{"checked": N, "wrong": [...], "errors": {...}}`` to ``$OUT/rank<r>.json``.

Values are small integers stored in each dtype, so every reduction is exact in float16 and
bfloat16 too, and the two backends must agree bit for bit (AVG, which Gloo lacks, is checked
against Gloo's SUM divided by the world size).
"""

from __future__ import annotations

import json
import os
import re
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.int32, torch.int64]
SIZES = [0, 1, 7, 1031]


def values(rank: int, n: int, dtype: torch.dtype, tag: int, lo: int = -4, hi: int = 5) -> Any:
    g = torch.Generator().manual_seed(rank * 1000 + n * 7 + tag)
    return torch.randint(lo, hi, (n,), generator=g).to(dtype)


def main() -> None:
    import collectives.pytorch as rocev2

    dist.init_process_group("rocev2")
    gloo = dist.new_group(backend="gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    wrong: list[str] = []
    checked = 0

    def same(what: str, ours: Any, theirs: Any) -> None:
        nonlocal checked
        checked += 1
        if (
            ours.dtype != theirs.dtype
            or ours.shape != theirs.shape
            or not torch.equal(ours, theirs)
        ):
            wrong.append(
                f"{what}: {ours.reshape(-1)[:6].tolist()} != {theirs.reshape(-1)[:6].tolist()}"
            )

    def both(what: str, run: Callable[[Any], Any]) -> None:
        """``run(group)`` with each backend; it returns the tensors to compare."""
        ours = run(None)
        theirs = run(gloo)
        for i, (a, b) in enumerate(zip(ours, theirs, strict=True)):
            same(f"{what}[{i}]", a, b)

    def case(dtype: torch.dtype, n: int, tag: int) -> None:
        name = f"{str(dtype).removeprefix('torch.')} n={n}"
        for op, lo, hi in [
            (dist.ReduceOp.SUM, -4, 5),
            (dist.ReduceOp.PRODUCT, -2, 3),
            (dist.ReduceOp.MIN, -4, 5),
            (dist.ReduceOp.MAX, -4, 5),
        ]:
            x = values(rank, n, dtype, tag, lo, hi)

            def all_reduce(g: Any, x: Any = x, op: Any = op) -> Any:
                t = x.clone()
                dist.all_reduce(t, op=op, group=g)
                return [t]

            both(f"all_reduce {op} {name}", all_reduce)
        x = values(rank, n, dtype, tag)
        t = x.clone()
        dist.all_reduce(t, op=dist.ReduceOp.AVG)
        s = x.clone()
        dist.all_reduce(s, group=gloo)
        want = (
            torch.div(s, world, rounding_mode="trunc")
            if not dtype.is_floating_point
            else (s.double() / world).to(dtype)
        )
        same(f"all_reduce AVG {name}", t, want)

        def broadcast(g: Any) -> Any:
            t = x.clone()
            dist.broadcast(t, src=1 % world, group=g)
            return [t]

        def all_gather(g: Any) -> Any:
            outs = [torch.empty(n, dtype=dtype) for _ in range(world)]
            dist.all_gather(outs, x, group=g)
            return outs

        def all_gather_tensor(g: Any) -> Any:
            out = torch.empty(n * world, dtype=dtype)
            dist.all_gather_into_tensor(out, x, group=g)
            return [out]

        big = values(rank, n * world, dtype, tag + 500)

        def reduce_scatter_tensor(g: Any) -> Any:
            out = torch.empty(n, dtype=dtype)
            dist.reduce_scatter_tensor(out, big, group=g)
            return [out]

        def reduce_scatter(g: Any) -> Any:
            out = torch.empty(n, dtype=dtype)
            dist.reduce_scatter(out, list(big.chunk(world)) if n else [big] * world, group=g)
            return [out]

        def all_to_all_single(g: Any) -> Any:
            out = torch.empty(n * world, dtype=dtype)
            dist.all_to_all_single(out, big, group=g)
            return [out]

        def all_to_all_uneven(g: Any) -> Any:
            # rank r sends r + j + (n % 3) elements to rank j
            sends = [rank + j + n % 3 for j in range(world)]
            recvs = [j + rank + n % 3 for j in range(world)]
            src = values(rank, sum(sends), dtype, tag + 900)
            out = torch.empty(sum(recvs), dtype=dtype)
            dist.all_to_all_single(out, src, recvs, sends, group=g)
            return [out]

        def all_to_all(g: Any) -> Any:
            ins = [values(rank, n, dtype, tag + 50 * j) for j in range(world)]
            outs = [torch.empty(n, dtype=dtype) for _ in range(world)]
            dist.all_to_all(outs, ins, group=g)
            return outs

        def reduce(g: Any) -> Any:
            t = x.clone()
            dist.reduce(t, dst=2 % world, group=g)
            return [t] if rank == 2 % world else []

        def gather(g: Any) -> Any:
            outs = [torch.empty(n, dtype=dtype) for _ in range(world)] if rank == 0 else None
            dist.gather(x, outs, dst=0, group=g)
            return outs or []

        def scatter(g: Any) -> Any:
            out = torch.empty(n, dtype=dtype)
            ins = [values(j, n, dtype, tag + 77) for j in range(world)] if rank == 1 else None
            dist.scatter(out, ins, src=1 % world, group=g)
            return [out]

        def send_recv(g: Any) -> Any:  # a ring: even ranks send first, odd ranks receive
            out = torch.empty(n, dtype=dtype)
            nxt, prv = (rank + 1) % world, (rank - 1) % world
            if rank % 2 == 0:
                dist.send(x, nxt, group=g)
                dist.recv(out, prv, group=g)
            else:
                dist.recv(out, prv, group=g)
                dist.send(x, nxt, group=g)
            return [out]

        for check in (
            broadcast,
            all_gather,
            all_gather_tensor,
            reduce_scatter_tensor,
            reduce_scatter,
            all_to_all_single,
            all_to_all_uneven,
            all_to_all,
            reduce,
            gather,
            scatter,
            send_recv,
        ):
            both(f"{check.__name__} {name}", check)
        # a strided (non-contiguous) tensor, written in place
        m = values(rank, 2 * n, dtype, tag + 3).reshape(2, n)

        def strided(g: Any, m: Any = m) -> Any:
            t = torch.zeros(n, 2, dtype=dtype).t()  # a transposed view: not contiguous
            t.copy_(m)
            dist.all_reduce(t, group=g)
            return [t.contiguous()]

        both(f"all_reduce strided {name}", strided)

    tag = 0
    for dtype in DTYPES:
        for n in SIZES:
            tag += 1
            case(dtype, n, tag)
    dist.barrier()
    errors: dict[str, str] = {}
    refused: dict[str, Callable[[], Any]] = {
        "meta device": lambda: dist.all_reduce(torch.ones(3, device="meta")),
        "uint8": lambda: dist.all_reduce(torch.ones(3, dtype=torch.uint8)),
        "bool": lambda: dist.broadcast(torch.ones(3, dtype=torch.bool), src=0),
        "BAND": lambda: dist.all_reduce(torch.ones(3, dtype=torch.int32), op=dist.ReduceOp.BAND),
        "sparse": lambda: dist.all_reduce(torch.ones(3).to_sparse()),
        "recv any source": lambda: dist.recv(torch.ones(3)),
        "bad root": lambda: dist.broadcast(torch.ones(3), src=world + 5),
    }
    for what, call in refused.items():
        try:
            call()
        except Exception as exc:
            errors[what] = f"{type(exc).__name__}: {exc}"
        else:
            errors[what] = "no error"
    # the group still works after the refused calls
    t = torch.ones(5)
    dist.all_reduce(t)
    same("all_reduce after errors", t, torch.full((5,), float(world)))
    step = rocev2.step(compute_ms=1.0)
    # the rank's host serves its /metrics, the training step's series among them
    address = rocev2.worker_env().topo.nodes[os.environ["ROCEV2_HOST"]].address
    with urllib.request.urlopen(f"http://{address}:9100/metrics", timeout=10) as resp:
        metrics = resp.read().decode()
    series = re.search(
        rf'^rocev2_torch_step_communication_seconds{{rank="{rank}"}} (\S+)$', metrics, re.M
    )
    scraped = float(series.group(1)) if series else None
    out = Path(os.environ["OUT"]) / f"rank{rank}.json"
    out.write_text(
        json.dumps(
            {
                "checked": checked,
                "wrong": wrong,
                "errors": errors,
                "ops": len(step.ops),
                "communication": step.communication,
                "scraped": scraped,
            }
        )
    )
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
