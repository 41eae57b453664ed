"""The ``rocev2`` process group: torch.distributed's operations over the emulated fabric.

A Python subclass of ``torch.distributed.ProcessGroup`` (torch supports one returned by a
registered backend's creator, as torchft's process groups do).  Each method checks its tensors
in the caller's thread (CPU, dense, one of the supported types: a clear ``TypeError`` or
``ValueError`` otherwise), queues the operation on the rank's
:class:`~collectives.pytorch.worker.FabricWorker`, and returns a
:class:`~collectives.pytorch.work.FabricWork` at once;
the operation writes its results into the caller's tensors in the fabric thread.

Types: float16, float32, float64, int32 and int64 travel as they are.  bfloat16 travels as its
16 bits where nothing is reduced; reductions of bfloat16 run in float32 (twice the bytes on the
wire) and round back to bfloat16 at the end, since the collectives reduce only numpy's types.

Reductions: SUM, PRODUCT, MIN, MAX and AVG (NCCL's set); the bitwise ops and PREMUL_SUM raise.
``send`` / ``recv`` match messages in order per peer (tags are not matched); ``recv`` from any
source is refused.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist

from collectives.comm.communicator import Communicator
from collectives.pytorch.tensors import Staged, check_tensor, one_dtype, reduce_op
from collectives.pytorch.work import FabricWork
from collectives.pytorch.worker import FabricWorker, Run


class RoceProcessGroup(dist.ProcessGroup):  # type: ignore[misc]
    """One rank's process group over the fabric (the default group of ``init_process_group``)."""

    def __init__(self, worker: FabricWorker, rank: int, size: int, timeout: float = 1800.0) -> None:
        super().__init__(rank, size)
        self.worker = worker
        self.timeout = timeout  # wall seconds a wait() may last (the group's timeout)
        self._rank = rank
        self._size = size

    def getBackendName(self) -> str:  # torch's name
        return "rocev2"

    # torch keeps a group's name and description in its C++ backends, which a Python group
    # has none of; DeviceMesh (FSDP2) reads them
    def _set_group_name(self, name: str) -> None:
        self._name = name

    @property
    def group_name(self) -> str:
        return getattr(self, "_name", "")

    def _set_group_desc(self, desc: str) -> None:
        self._desc = desc

    @property
    def group_desc(self) -> str:
        return getattr(self, "_desc", "")

    def shutdown(self) -> None:
        """``destroy_process_group``: finish what is queued, close the rank's NIC."""
        self.worker.close()

    def abort(self) -> None:
        self.worker.close(timeout=1.0)

    @property
    def _device_types(self) -> list[Any]:
        return [torch.device("cpu")]

    def _submit(self, name: str, run: Run, value: Any) -> FabricWork:
        future: Any = torch.futures.Future()

        async def body(comm: Communicator) -> Any:
            await run(comm)
            return value

        self.worker.submit(name, body, future)
        return FabricWork(future, name, self.timeout)

    # -- reductions ---------------------------------------------------------------------
    def allreduce(self, tensors: Any, opts: Any = None) -> FabricWork:
        tensors = [tensors] if isinstance(tensors, torch.Tensor) else list(tensors)
        op = reduce_op(opts.reduceOp if opts is not None else dist.ReduceOp.SUM)
        staged = [Staged(t, reduced=True, what="allreduce") for t in tensors]

        async def run(comm: Communicator) -> None:
            for s in staged:
                await comm.all_reduce(s.array, op, out=s.array)
                s.finish()

        return self._submit("allreduce", run, tensors)

    def allreduce_coalesced(self, tensors: Any, opts: Any = None) -> FabricWork:
        return self.allreduce(tensors, opts)

    def reduce(self, tensors: Any, opts: Any = None) -> FabricWork:
        tensors = list(tensors)
        op = reduce_op(opts.reduceOp)
        root = int(opts.rootRank)
        staged = [Staged(t, reduced=True, what="reduce") for t in tensors]

        async def run(comm: Communicator) -> None:
            for s in staged:
                await comm.reduce(s.array, root, op, out=s.array)
                s.finish()

        return self._submit("reduce", run, tensors)

    def _reduce_scatter_base(self, output: Any, input: Any, opts: Any = None) -> FabricWork:
        op = reduce_op(opts.reduceOp if opts is not None else dist.ReduceOp.SUM)
        one_dtype([output, input], "reduce_scatter_tensor")
        if input.numel() != output.numel() * self._size:
            raise ValueError(
                f"rocev2 backend: reduce_scatter_tensor: input has {input.numel()} elements, "
                f"output {output.numel()}; the input must hold world size ({self._size}) outputs"
            )
        src = Staged(input, reduced=True, what="reduce_scatter_tensor input")
        dst = Staged(output, reduced=True, what="reduce_scatter_tensor output")

        async def run(comm: Communicator) -> None:
            await comm.reduce_scatter(src.array, op, out=dst.array)
            dst.finish()

        return self._submit("reduce_scatter", run, [output])

    def reduce_scatter_tensor_coalesced(
        self, outputs: Any, inputs: Any, opts: Any = None
    ) -> FabricWork:
        works = list(zip(outputs, inputs, strict=True))
        op = reduce_op(opts.reduceOp if opts is not None else dist.ReduceOp.SUM)
        pairs = [
            (
                Staged(i, reduced=True, what="reduce_scatter input"),
                Staged(o, reduced=True, what="reduce_scatter output"),
            )
            for o, i in works
        ]

        async def run(comm: Communicator) -> None:
            for src, dst in pairs:
                await comm.reduce_scatter(src.array, op, out=dst.array)
                dst.finish()

        return self._submit("reduce_scatter", run, list(outputs))

    def reduce_scatter(
        self, output_tensors: Any, input_tensors: Any, opts: Any = None
    ) -> FabricWork:
        op = reduce_op(opts.reduceOp if opts is not None else dist.ReduceOp.SUM)
        outs, ins = list(output_tensors), [list(x) for x in input_tensors]
        if len(outs) != 1 or len(ins) != 1 or len(ins[0]) != self._size:
            raise ValueError(
                f"rocev2 backend: reduce_scatter: one output and {self._size} inputs per rank"
            )
        chunks = ins[0]
        one_dtype([outs[0], *chunks], "reduce_scatter")
        if any(c.numel() != outs[0].numel() for c in chunks):
            raise ValueError("rocev2 backend: reduce_scatter: every input as large as the output")
        for c in chunks:
            check_tensor(c, "reduce_scatter input")
        whole = torch.cat([c.reshape(-1) for c in chunks]) if chunks else outs[0].new_empty(0)
        src = Staged(whole, reduced=True, what="reduce_scatter input")
        dst = Staged(outs[0], reduced=True, what="reduce_scatter output")

        async def run(comm: Communicator) -> None:
            await comm.reduce_scatter(src.array, op, out=dst.array)
            dst.finish()

        return self._submit("reduce_scatter", run, outs)

    # -- data movement ------------------------------------------------------------------
    def broadcast(self, tensors: Any, opts: Any = None) -> FabricWork:
        tensors = [tensors] if isinstance(tensors, torch.Tensor) else list(tensors)
        root = int(opts.rootRank) if opts is not None else 0
        self._check_rank(root, "broadcast root")
        staged = [Staged(t, reduced=False, what="broadcast") for t in tensors]

        async def run(comm: Communicator) -> None:
            for s in staged:
                await comm.broadcast(s.array, root, out=s.array)
                s.finish()

        return self._submit("broadcast", run, tensors)

    def allgather(self, output_tensors: Any, input_tensors: Any, opts: Any = None) -> FabricWork:
        outs = [list(x) for x in output_tensors]
        ins = list(input_tensors)
        if len(ins) != len(outs) or any(len(o) != self._size for o in outs):
            raise ValueError(
                f"rocev2 backend: allgather: {self._size} outputs for each input tensor"
            )
        jobs = []
        for out_list, inp in zip(outs, ins, strict=True):
            one_dtype([inp, *out_list], "allgather")
            if any(o.numel() != inp.numel() for o in out_list):
                raise ValueError("rocev2 backend: allgather: every output as large as the input")
            jobs.append(
                (
                    Staged(inp, reduced=False, what="allgather input"),
                    [Staged(o, reduced=False, what="allgather output") for o in out_list],
                )
            )

        async def run(comm: Communicator) -> None:
            for src, dsts in jobs:
                whole = await comm.all_gather(src.array)
                n = src.array.size
                for r, dst in enumerate(dsts):
                    dst.array[:] = whole[r * n : (r + 1) * n]
                    dst.finish()

        return self._submit("allgather", run, outs)

    def _allgather_base(self, output: Any, input: Any, opts: Any = None) -> FabricWork:
        one_dtype([output, input], "all_gather_into_tensor")
        if output.numel() != input.numel() * self._size:
            raise ValueError(
                f"rocev2 backend: all_gather_into_tensor: output has {output.numel()} elements, "
                f"input {input.numel()}; the output must hold world size ({self._size}) inputs"
            )
        src = Staged(input, reduced=False, what="all_gather_into_tensor input")
        dst = Staged(output, reduced=False, what="all_gather_into_tensor output")

        async def run(comm: Communicator) -> None:
            await comm.all_gather(src.array, out=dst.array)
            dst.finish()

        return self._submit("allgather", run, [output])

    def allgather_into_tensor_coalesced(
        self, outputs: Any, inputs: Any, opts: Any = None
    ) -> FabricWork:
        pairs = [
            (
                Staged(i, reduced=False, what="allgather input"),
                Staged(o, reduced=False, what="allgather output"),
            )
            for o, i in zip(outputs, inputs, strict=True)
        ]

        async def run(comm: Communicator) -> None:
            for src, dst in pairs:
                await comm.all_gather(src.array, out=dst.array)
                dst.finish()

        return self._submit("allgather", run, list(outputs))

    def gather(self, output_tensors: Any, input_tensors: Any, opts: Any = None) -> FabricWork:
        root = int(opts.rootRank)
        self._check_rank(root, "gather root")
        ins = list(input_tensors)
        outs = [list(x) for x in output_tensors] if self._rank == root else [[]]
        src = Staged(ins[0], reduced=False, what="gather input")
        dsts = [Staged(o, reduced=False, what="gather output") for o in outs[0]]

        async def run(comm: Communicator) -> None:
            whole = await comm.all_gather(src.array)  # every rank gets it; the root keeps it
            n = src.array.size
            for r, dst in enumerate(dsts):
                dst.array[:] = whole[r * n : (r + 1) * n]
                dst.finish()

        return self._submit("gather", run, outs)

    def scatter(self, output_tensors: Any, input_tensors: Any, opts: Any = None) -> FabricWork:
        root = int(opts.rootRank)
        self._check_rank(root, "scatter root")
        dst = Staged(next(iter(output_tensors)), reduced=False, what="scatter output")
        n = dst.array.size
        if self._rank == root:
            chunks = list(next(iter(input_tensors)))
            whole = torch.cat([c.reshape(-1) for c in chunks])
            src = Staged(whole, reduced=False, what="scatter input")
            sends = [n] * self._size
        else:
            src = Staged(dst.tensor.new_empty(0), reduced=False, what="scatter input")
            sends = [0] * self._size
        recvs = [n if r == root else 0 for r in range(self._size)]

        async def run(comm: Communicator) -> None:
            await comm.all_to_all_v(src.array, sends, recvs, out=dst.array)
            dst.finish()

        return self._submit("scatter", run, list(output_tensors))

    def alltoall_base(
        self,
        output: Any,
        input: Any,
        output_split_sizes: Sequence[int],
        input_split_sizes: Sequence[int],
        opts: Any = None,
    ) -> FabricWork:
        one_dtype([output, input], "all_to_all_single")
        sends = self._counts(input, list(input_split_sizes), "input")
        recvs = self._counts(output, list(output_split_sizes), "output")
        src = Staged(input, reduced=False, what="all_to_all_single input")
        dst = Staged(output, reduced=False, what="all_to_all_single output")

        async def run(comm: Communicator) -> None:
            await comm.all_to_all_v(src.array, sends, recvs, out=dst.array)
            dst.finish()

        return self._submit("alltoall", run, [output])

    def alltoall(self, output_tensors: Any, input_tensors: Any, opts: Any = None) -> FabricWork:
        outs, ins = list(output_tensors), list(input_tensors)
        if len(outs) != self._size or len(ins) != self._size:
            raise ValueError(f"rocev2 backend: all_to_all: {self._size} inputs and outputs")
        one_dtype([*outs, *ins], "all_to_all")
        for t in (*outs, *ins):
            check_tensor(t, "all_to_all")
        whole = torch.cat([t.reshape(-1) for t in ins])
        src = Staged(whole, reduced=False, what="all_to_all input")
        sends = [t.numel() for t in ins]
        recvs = [t.numel() for t in outs]
        dsts = [Staged(t, reduced=False, what="all_to_all output") for t in outs]

        async def run(comm: Communicator) -> None:
            got = await comm.all_to_all_v(src.array, sends, recvs)
            at = 0
            for dst in dsts:
                dst.array[:] = got[at : at + dst.array.size]
                at += dst.array.size
                dst.finish()

        return self._submit("alltoall", run, outs)

    def send(self, tensors: Any, dstRank: int, tag: int = 0) -> FabricWork:
        self._check_rank(dstRank, "send peer")
        staged = [Staged(t, reduced=False, what="send") for t in tensors]

        async def run(comm: Communicator) -> None:
            for s in staged:
                await comm.send(s.array, int(dstRank))

        return self._submit("send", run, list(tensors))

    def recv(self, tensors: Any, srcRank: int, tag: int = 0) -> FabricWork:
        self._check_rank(srcRank, "recv peer")
        staged = [Staged(t, reduced=False, what="recv") for t in tensors]

        async def run(comm: Communicator) -> None:
            for s in staged:
                await comm.recv(s.array, int(srcRank))
                s.finish()

        return self._submit("recv", run, list(tensors))

    def recv_anysource(self, tensors: Any, tag: int = 0) -> FabricWork:
        raise ValueError("rocev2 backend: recv from any source is not supported; name the peer")

    def barrier(self, opts: Any = None) -> FabricWork:
        async def run(comm: Communicator) -> None:
            await comm.barrier()

        return self._submit("barrier", run, [])

    def allgather_coalesced(
        self, output_lists: Any, input_list: Any, opts: Any = None
    ) -> FabricWork:
        return self.allgather(output_lists, input_list, opts)

    # torch 2.13's names for the single-tensor forms (the C++ side keeps the older ones)
    all_gather_single = _allgather_base
    reduce_scatter_single = _reduce_scatter_base
    all_to_all_single = alltoall_base
    all_gather_single_coalesced = allgather_into_tensor_coalesced
    reduce_scatter_single_coalesced = reduce_scatter_tensor_coalesced

    # -- helpers ------------------------------------------------------------------------
    def _check_rank(self, rank: Any, what: str) -> None:
        if not isinstance(rank, int) or not 0 <= rank < self._size:
            raise ValueError(f"rocev2 backend: {what} {rank!r} is no rank of 0..{self._size - 1}")

    def _counts(self, t: Any, splits: list[int], what: str) -> list[int]:
        """all_to_all_single's split sizes (rows of dim 0) as element counts per rank."""
        rows = t.shape[0] if t.dim() else 1
        per_row = t.numel() // rows if rows else 0
        if not splits:
            if rows % self._size:
                raise ValueError(
                    f"rocev2 backend: all_to_all_single: {what} has {rows} rows, not a multiple "
                    f"of the world size {self._size}"
                )
            splits = [rows // self._size] * self._size
        if len(splits) != self._size or sum(splits) != rows:
            raise ValueError(
                f"rocev2 backend: all_to_all_single: {what} split sizes {splits} do not cut "
                f"{rows} rows into {self._size}"
            )
        return [s * per_row for s in splits]
