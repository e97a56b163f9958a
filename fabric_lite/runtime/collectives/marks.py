"""How a rank without real data in a predicted collective is marked, and how every rank sees it. Floats carry a value
that absorbs every other under the reduction (NaN, or ±inf for max and min), integers under max and min their dtype's
extreme, and one element of the result, the probe, tells. Integer sums, means and products and booleans have no such
value: a flag travels beside their data."""

from __future__ import annotations

import ctypes
import math
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from fabric_lite.runtime.collectives.ops import _BOOL_OPS, _MEAN, ReduceOp

_POISON = {ReduceOp.SUM: math.nan, _MEAN: math.nan, ReduceOp.PRODUCT: math.nan, ReduceOp.MAX: math.inf}
_POISON[ReduceOp.MIN] = -math.inf
_FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
# dtypes whose predicted reductions carry a flag (see _reduce_planned): wide enough that a sum of one per rank cannot
# wrap around, or booleans (reduced with max or min)
_FLAGGED = (torch.int32, torch.int64, torch.bool)
# integers do have values that absorb every other under max and min, their dtype's largest and smallest: those
# reductions are marked in the buffer as floats are (a real extreme in the probe costs the exchange, as a real NaN does)
_INT_WORDS = {torch.int32: ctypes.c_int32, torch.int64: ctypes.c_int64}


def _mark(op: Any, dtype: torch.dtype) -> float | int | None:
    """The value that marks a rank without real data in a reduction of ``dtype`` with ``op`` (see the module docstring),
    or ``None`` where the dtype has none and a flag travels instead."""
    if dtype in _FLOATS:
        return _POISON.get(op)
    if dtype in _INT_WORDS and op in (ReduceOp.MAX, ReduceOp.MIN):
        info = torch.iinfo(dtype)
        return info.max if op == ReduceOp.MAX else info.min
    return None


def _flag(op: Any, dtype: torch.dtype, real: bool, world_size: int) -> tuple[int, int]:
    """``(sent, expected)``: what this rank sends as the flag of a predicted integer or boolean reduction with ``op``,
    and the reduced flag when every rank sent real data. A rank without real data sends a value the reduction cannot
    turn into ``expected``."""
    if dtype == torch.bool:
        op = _BOOL_OPS.get(op, op)
    if op == ReduceOp.MAX:
        return (0 if real else 1), 0
    if op in (ReduceOp.SUM, _MEAN):
        return int(real), world_size
    return int(real), 1  # product and min: one poisoned rank makes the result 0


def _finite(values: Tensor) -> bool:
    return bool(torch.isfinite(values).all()) if values.numel() > 1 else math.isfinite(values.item())


# the exponent bits of each float dtype: a value is NaN or infinite exactly when they are all set
_EXPONENT_BITS = {
    torch.float16: (ctypes.c_uint16, 0x7C00),
    torch.bfloat16: (ctypes.c_uint16, 0x7F80),
    torch.float32: (ctypes.c_uint32, 0x7F800000),
    torch.float64: (ctypes.c_uint64, 0x7FF0000000000000),
}


def _rows_start_clean(rows: Tensor, op: Any) -> bool:
    """Whether no row of the 2-D CPU tensor ``rows`` starts with the mark of a rank without real data (for floats, any
    non-finite value)."""
    base, step = rows.data_ptr(), rows.stride(0) * rows.element_size()
    return _clean_at([base + r * step for r in range(rows.shape[0])], rows.dtype, op)


def _clean_at(addresses: Sequence[int], dtype: torch.dtype, op: Any) -> bool:
    """Whether no element of ``dtype`` at ``addresses`` (CPU memory) is :func:`_mark`'s value (for floats: every one is
    finite), read straight from memory: far cheaper than indexing and ``item()``."""
    word = _INT_WORDS.get(dtype)
    if word is None:
        word, exponent = _EXPONENT_BITS[dtype]
        return all(word.from_address(a).value & exponent != exponent for a in addresses)
    mark = _mark(op, dtype)
    return all(word.from_address(a).value != mark for a in addresses)
