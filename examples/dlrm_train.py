"""Train a small recommendation model (DLRM's shape) over the emulated fabric.

    rocev2-emu launch examples/topologies/leaf-spine.toml --compute-ms 1 -- \\
        python examples/dlrm_train.py --steps 5

The model of Naumov et al. (2019), the seed's MTIA workload, shrunk: each rank owns ``--tables``
embedding tables (model parallel: tables are sharded over the ranks) and a replica of the dense
part (data parallel: a bottom MLP over the dense features, a top MLP over them and every
table's pooled embedding).  Per step, every rank's batch looks up every table: the owners pool
the rows their tables hold for all ranks' samples and an all-to-all hands each rank its
samples' embeddings (``torch.distributed.nn.functional.all_to_all_single``, whose backward is
the all-to-all of the gradients back to the owners); DDP all-reduces the dense gradients.  The
sparse indices of every rank's samples are generated from (step, rank), so each owner knows
them without the input all-to-all a real DLRM also runs.

Per step, rank 0 prints the loss and the step's communication on the fabric (emulated), split
into the all-to-alls and the all-reduces: the interconnect tax by collective.  ``--backend
gloo`` runs the same training over torch's Gloo, and ``--save FILE`` writes rank 0's final
parameters: the tests compare the two.
"""

from __future__ import annotations

import argparse

import torch
import torch.distributed as dist
import torch.distributed.nn.functional as dist_fn
from torch import nn

DENSE = 13  # dense features per sample (the Criteo datasets' 13)


class Shard(nn.Module):
    """This rank's embedding tables (``tables`` of ``rows`` x ``dim``), pooled by sum."""

    def __init__(self, tables: int, rows: int, dim: int, rank: int) -> None:
        super().__init__()
        torch.manual_seed(100 + rank)  # each owner's tables: its own
        self.bags = nn.ModuleList(nn.EmbeddingBag(rows, dim, mode="sum") for _ in range(tables))

    def forward(self, indices: torch.Tensor) -> torch.Tensor:
        """``indices``: [samples, tables, lookups] -> [samples, tables, dim]."""
        return torch.stack([bag(indices[:, t]) for t, bag in enumerate(self.bags)], dim=1)


class Dense(nn.Module):
    """The replicated part: bottom MLP, then the top MLP over it and the embeddings."""

    def __init__(self, tables: int, dim: int, width: int) -> None:
        super().__init__()
        torch.manual_seed(0)  # the same on every rank
        self.bottom = nn.Sequential(nn.Linear(DENSE, width), nn.ReLU(), nn.Linear(width, dim))
        self.top = nn.Sequential(
            nn.Linear(dim * (tables + 1), width), nn.ReLU(), nn.Linear(width, 1)
        )

    def forward(self, dense: torch.Tensor, embedded: torch.Tensor) -> torch.Tensor:
        x = self.bottom(dense)
        return self.top(torch.cat([x, embedded.flatten(1)], dim=1))


def indices(step: int, rank: int, batch: int, tables: int, rows: int, lookups: int) -> torch.Tensor:
    """The sparse features of ``rank``'s batch in ``step``, for every table of the job:
    [batch, tables (all ranks' tables, owner-major), lookups]."""
    gen = torch.Generator().manual_seed(step * 65_537 + rank)
    return torch.randint(0, rows, (batch, tables, lookups), generator=gen)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--batch", type=int, default=64, help="samples per rank")
    p.add_argument("--tables", type=int, default=2, help="embedding tables per rank")
    p.add_argument("--rows", type=int, default=1000, help="rows per table")
    p.add_argument("--dim", type=int, default=16, help="floats per embedding")
    p.add_argument("--lookups", type=int, default=4, help="rows pooled per sample and table")
    p.add_argument("--width", type=int, default=64, help="the MLPs' hidden width")
    p.add_argument("--lr", type=float, default=0.01, help="SGD's learning rate")
    p.add_argument("--backend", default="rocev2", choices=["rocev2", "gloo"])
    p.add_argument("--save", help="write rank 0's final parameters here (torch.save)")
    args = p.parse_args()

    if args.backend == "rocev2":
        import collectives.pytorch as rocev2  # registers the backend (the entry point does too)
    dist.init_process_group(args.backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    shard = Shard(args.tables, args.rows, args.dim, rank)
    dense = nn.parallel.DistributedDataParallel(Dense(world * args.tables, args.dim, args.width))
    opt = torch.optim.SGD([*shard.parameters(), *dense.parameters()], lr=args.lr)
    gen = torch.Generator().manual_seed(1000 + rank)
    target = torch.randn(DENSE, 1, generator=torch.Generator().manual_seed(7))
    mine = slice(rank * args.tables, (rank + 1) * args.tables)  # this rank's tables, job-wide
    if rank == 0:
        print(
            f"# DLRM, {world} ranks, {world * args.tables} tables of {args.rows} x {args.dim} "
            f"(sharded), backend {args.backend}",
            flush=True,
        )
        print("# step    loss  all_to_all_us(emul)  all_reduce_us(emul)  a2a_share", flush=True)
    for step in range(args.steps):
        x = torch.randn(args.batch, DENSE, generator=gen)
        y = x @ target
        # the owner pools its tables' rows for every rank's samples, rank-major
        wanted = torch.cat(
            [
                indices(step, r, args.batch, world * args.tables, args.rows, args.lookups)[:, mine]
                for r in range(world)
            ]
        )
        pooled = shard(wanted)  # [world * batch, tables, dim]
        received = dist_fn.all_to_all_single(
            torch.empty_like(pooled), pooled.contiguous()
        )  # [world (owners) * batch, tables, dim]: my samples, every owner's tables
        embedded = received.view(world, args.batch, args.tables, args.dim).permute(1, 0, 2, 3)
        opt.zero_grad()
        loss = nn.functional.mse_loss(dense(x, embedded.reshape(args.batch, -1, args.dim)), y)
        loss.backward()  # the gradients' all-to-all back to the owners; DDP's all-reduces
        opt.step()
        if args.backend == "rocev2":
            s = rocev2.step()
            a2a = sum(sec for op, _, sec in s.ops if op == "alltoall")
            ar = sum(sec for op, _, sec in s.ops if op == "allreduce")
            share = a2a / (a2a + ar) if a2a + ar else 0.0
            figures = f"{a2a * 1e6:19.1f}  {ar * 1e6:19.1f}  {share:9.2f}"
        else:
            figures = f"{'-':>19}  {'-':>19}  {'-':>9}"
        if rank == 0:
            print(f"{step:6d}  {loss.item():6.4f}  {figures}", flush=True)
    state = {f"dense.{k}": v.detach().clone() for k, v in dense.module.state_dict().items()}
    state |= {f"shard.{k}": v.detach().clone() for k, v in shard.state_dict().items()}
    if args.save and rank == 0:
        torch.save(state, args.save)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
