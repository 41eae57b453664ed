"""Tensors as the collectives take them: which torch dtypes travel and as what (bfloat16 as
its 16 bits, reduced in float32), the reduce ops NCCL has, the checks on every tensor a
``rocev2`` process group is given (CPU, dense, a supported dtype), and :class:`Staged` - a
tensor as a numpy array and the way back (shared memory where it can be, one copy otherwise).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

_MOVED = {  # torch dtype -> the dtype its bits travel as
    torch.float16: torch.float16,
    torch.bfloat16: torch.float16,  # 16 bits, not reduced
    torch.float32: torch.float32,
    torch.float64: torch.float64,
    torch.int32: torch.int32,
    torch.int64: torch.int64,
}
_REDUCED = {**_MOVED, torch.bfloat16: torch.float32}  # bfloat16 reduces in float32
_OPS = {
    dist.ReduceOp.SUM: "sum",
    dist.ReduceOp.PRODUCT: "prod",
    dist.ReduceOp.MIN: "min",
    dist.ReduceOp.MAX: "max",
    dist.ReduceOp.AVG: "avg",
}
SUPPORTED_DTYPES = tuple(str(t).removeprefix("torch.") for t in _MOVED)


def reduce_op(op: Any) -> str:
    for known, name in _OPS.items():
        if op == known:
            return name
    what = str(getattr(op, "op", op)).removeprefix("RedOpType.")
    raise ValueError(
        f"rocev2 backend: reduce op {what} is not supported (SUM, PRODUCT, MIN, MAX, AVG)"
    )


class Staged:
    """A tensor as a numpy array the collectives can read and write, and the way back.

    A contiguous tensor of a type that travels as it is shares its memory with the array;
    otherwise the array is a copy (bfloat16 reduced in float32, a strided tensor made
    contiguous) and :meth:`finish` writes it back."""

    def __init__(self, tensor: Any, *, reduced: bool, what: str) -> None:
        check_tensor(tensor, what)
        self.tensor = tensor
        wire = (_REDUCED if reduced else _MOVED)[tensor.dtype]
        if wire == tensor.dtype:
            buf = tensor if tensor.is_contiguous() else tensor.contiguous()
        elif wire.itemsize == tensor.dtype.itemsize:  # bfloat16's bits as float16's
            buf = tensor.contiguous().view(wire)
        else:
            buf = tensor.to(wire, memory_format=torch.contiguous_format)
        self.buf = buf
        self.array: np.ndarray = buf.detach().numpy().reshape(-1)
        self._shared = buf.data_ptr() == tensor.data_ptr() and buf.dtype == tensor.dtype

    def finish(self) -> None:
        if self._shared:
            return
        with torch.no_grad():
            if self.buf.dtype.itemsize == self.tensor.dtype.itemsize:
                self.tensor.copy_(self.buf.view(self.tensor.dtype).reshape(self.tensor.shape))
            else:
                self.tensor.copy_(self.buf.reshape(self.tensor.shape))


def check_tensor(t: Any, what: str) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"rocev2 backend: {what}: a torch.Tensor, not {type(t).__name__}")
    if t.device.type != "cpu":
        raise TypeError(
            f"rocev2 backend: {what}: a {t.device.type} tensor; the emulated NIC reads host "
            "memory, so use CPU tensors"
        )
    if t.layout != torch.strided:
        raise TypeError(f"rocev2 backend: {what}: a {t.layout} tensor; only dense tensors")
    if t.dtype not in _MOVED:
        raise TypeError(
            f"rocev2 backend: {what}: dtype {t.dtype} is not supported "
            f"({', '.join(SUPPORTED_DTYPES)})"
        )


def one_dtype(tensors: Sequence[Any], what: str) -> None:
    kinds = {t.dtype for t in tensors}
    if len(kinds) > 1:
        raise TypeError(
            f"rocev2 backend: {what}: tensors of several dtypes {sorted(map(str, kinds))}"
        )
