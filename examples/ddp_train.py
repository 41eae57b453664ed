"""Train a small MLP with DistributedDataParallel over the emulated fabric.

    rocev2-emu launch examples/topologies/leaf-spine.toml --compute-ms 5 -- \\
        python examples/ddp_train.py --steps 5

Each rank trains on its own synthetic batch (seeded by rank); DDP all-reduces the gradients in
buckets while backward runs, over the ``rocev2`` backend: RoCEv2 frames through the emulated
switches.  Per step, rank 0 prints the loss, the CPU's compute time (wall), the step's
communication on the fabric (emulated) and the part of it the overlap model cannot hide
(docs/pytorch.md), then the fabric's pause frames, ECN marks, CNPs and retransmissions.

``--fsdp`` shards the model with FSDP2 (``fully_shard``: parameters all-gathered before use,
gradients reduce-scattered) instead of DDP.  ``--backend gloo`` runs the same training over
torch's Gloo (no emulated fabric), and ``--save FILE`` writes the final parameters (rank 0):
the tests compare the two.
"""

from __future__ import annotations

import argparse
import json
import time

import torch
import torch.distributed as dist
from torch import nn


def model(width: int) -> nn.Module:
    torch.manual_seed(0)  # the same initial weights on every rank (DDP broadcasts rank 0's)
    return nn.Sequential(
        nn.Linear(32, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 1)
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--width", type=int, default=256, help="hidden width (256: 75 k parameters)")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--backend", default="rocev2", choices=["rocev2", "gloo"])
    p.add_argument("--bucket-mb", type=float, default=0.1, help="DDP's bucket_cap_mb")
    p.add_argument("--fsdp", action="store_true", help="FSDP2 (fully_shard) instead of DDP")
    p.add_argument("--save", help="write rank 0's final parameters here (torch.save)")
    p.add_argument(
        "--report",
        metavar="DIR",
        help="each rank writes its step reports to DIR/rankN.json (per step: the communication "
        "and each collective's emulated seconds; on the exact clock the same on every run)",
    )
    args = p.parse_args()

    if args.backend == "rocev2":
        import collectives.pytorch as rocev2  # registers the backend (the entry point does too)
    dist.init_process_group(args.backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    net = model(args.width)
    if args.fsdp:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh("cpu", (world,))
        for layer in net:
            if isinstance(layer, nn.Linear):
                fully_shard(layer, mesh=mesh)
        ddp = fully_shard(net, mesh=mesh)
    else:
        ddp = nn.parallel.DistributedDataParallel(net, bucket_cap_mb=args.bucket_mb)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    gen = torch.Generator().manual_seed(1000 + rank)
    target = torch.randn(32, 1, generator=torch.Generator().manual_seed(7))
    if rank == 0:
        n = sum(p.numel() for p in net.parameters())
        how = "FSDP2" if args.fsdp else "DDP"
        print(f"# {how}, {world} ranks, {n} parameters, backend {args.backend}", flush=True)
        print(
            "# step    loss  step_ms(wall)  collectives  comm_ms(emul)  exposed_ms   tax",
            flush=True,
        )
    reports = []
    for i in range(args.steps):
        x = torch.randn(args.batch, 32, generator=gen)
        y = x @ target
        t0 = time.perf_counter()
        opt.zero_grad()
        loss = nn.functional.mse_loss(ddp(x), y)
        loss.backward()  # DDP's bucket all-reduces (FSDP's reduce-scatters) overlap this
        opt.step()
        wall = (time.perf_counter() - t0) * 1e3
        if args.backend == "rocev2":
            s = rocev2.step()  # this step's collectives, and the tax under --compute-ms
            reports.append(s.as_dict())
            figures = f"{len(s.ops):11d}  {s.communication * 1e3:13.3f}  " + (
                f"{s.exposed * 1e3:10.3f}  {s.tax:4.2f}" if s.compute else f"{'-':>10}  {'-':>4}"
            )
        else:
            figures = f"{'-':>11}  {'-':>13}  {'-':>10}  {'-':>4}"
        if rank == 0:
            print(f"{i:6d}  {loss.item():6.4f}  {wall:13.1f}  {figures}", flush=True)
    if args.backend == "rocev2" and rank == 0:
        c = rocev2.counters()
        print(
            f"# fabric: {c.get('pfc_tx', 0)} pause frames, {c.get('ecn_marked', 0)} ECN marks, "
            f"{c.get('cnps_sent', 0)} CNPs sent by rank 0's NIC, "
            f"{c.get('retransmitted', 0)} retransmissions by rank 0's NIC",
            flush=True,
        )
    # FSDP's parameters are shards (DTensors): gathering them whole is a collective
    state = {
        k: (v.full_tensor() if hasattr(v, "full_tensor") else v).detach().clone()
        for k, v in net.state_dict().items()
    }
    if args.save and rank == 0:
        torch.save(state, args.save)
    if args.report:
        with open(f"{args.report}/rank{rank}.json", "w") as f:
            json.dump(reports, f, indent=1)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
