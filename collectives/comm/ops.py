"""Reduction operators and element types, as NCCL names them (ncclRedOp_t, ncclDataType_t).

Ops: ``sum``, ``prod``, ``min``, ``max`` and ``avg`` (a sum divided by the rank count at the
end; integers divide truncating toward zero, as C's ``/`` in NCCL's kernels).  Types: the
numpy dtypes float16/32/64 and int32/64, with nccl-tests' names (``half``, ``float``,
``double``, ``int32``, ``int64``) for the benchmark's ``-d``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

import numpy as np

DTYPES: Final[dict[str, np.dtype]] = {
    "half": np.dtype(np.float16),
    "float": np.dtype(np.float32),
    "double": np.dtype(np.float64),
    "int32": np.dtype(np.int32),
    "int64": np.dtype(np.int64),
}
DTYPE_NAMES: Final[dict[np.dtype, str]] = {v: k for k, v in DTYPES.items()}
OPS: Final = ("sum", "prod", "min", "max", "avg")

_COMBINE: Final[dict[str, Callable[[np.ndarray, np.ndarray], None]]] = {
    "sum": lambda acc, x: np.add(acc, x, out=acc),
    "avg": lambda acc, x: np.add(acc, x, out=acc),
    "prod": lambda acc, x: np.multiply(acc, x, out=acc),
    "min": lambda acc, x: np.minimum(acc, x, out=acc),
    "max": lambda acc, x: np.maximum(acc, x, out=acc),
}


def check(op: str, dtype: np.dtype) -> None:
    if op not in OPS:
        raise ValueError(f"reduction op {op!r}: use one of {', '.join(OPS)}")
    if dtype not in DTYPE_NAMES:
        raise TypeError(f"dtype {dtype}: use one of float16, float32, float64, int32, int64")


def combine(op: str, acc: np.ndarray, incoming: np.ndarray) -> None:
    """``acc <- acc (op) incoming``, in place."""
    _COMBINE[op](acc, incoming)


def finish(op: str, acc: np.ndarray, ranks: int) -> None:
    """What ``avg`` does after the sum, in place; nothing for the other ops."""
    if op != "avg" or ranks == 1:
        return
    if acc.dtype.kind == "f":
        np.divide(acc, ranks, out=acc, casting="unsafe")
    else:
        np.copyto(acc, np.sign(acc) * (np.abs(acc) // ranks))


def reference(op: str, inputs: list[np.ndarray]) -> np.ndarray:
    """What the collective must produce, computed by numpy (the tests' oracle)."""
    stacked = np.stack(inputs)
    if op in ("sum", "avg"):
        out: np.ndarray = stacked.sum(axis=0, dtype=stacked.dtype)
        finish(op, out, len(inputs))
        return out
    if op == "prod":
        return np.asarray(stacked.prod(axis=0, dtype=stacked.dtype), dtype=stacked.dtype)
    picked: np.ndarray = stacked.min(axis=0) if op == "min" else stacked.max(axis=0)
    return picked
