"""Horovod's collectives with every dtype and fabric_lite's reduction semantics."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from fabric_lite.runtime.collectives.ops import _MEAN
from fabric_lite.utilities.types import ReduceOp as _ReduceOp

# Horovod matches the processes' collectives by name; these run one at a time, so a fixed name per kind is unique
BROADCAST_NAME = "fabric_lite.broadcast"
_REDUCE_NAME = "fabric_lite.all_reduce"
_GATHER_NAME = "fabric_lite.all_gather"


class HorovodAllGatherGrad(torch.autograd.Function):
    """Horovod all-gather whose backward sends every process the summed gradient of its own slice."""

    @staticmethod
    def forward(ctx: Any, tensor: Tensor, hvd: Any) -> Tensor:
        ctx.hvd = hvd
        return all_gather(hvd, tensor.detach())

    @staticmethod
    def backward(ctx: Any, *grad_output: Tensor) -> tuple[Tensor, None]:
        hvd = ctx.hvd
        grad = grad_output[0].contiguous().clone()
        all_reduce_(hvd, grad, _ReduceOp.SUM, int(hvd.size()))
        return grad[hvd.rank()], None


# Horovod 0.28's PyTorch extension all-reduces only float16/32/64 and int32/64, and gathers no bool, bfloat16 or
# complex tensors: the others travel as a dtype it has and come back (integers widened, so sums wrap exactly as
# torch.distributed's do once cast back; bfloat16 reduced in float32)
_REDUCE_WIRE = {
    torch.bool: torch.int32,
    torch.uint8: torch.int32,
    torch.int8: torch.int32,
    torch.int16: torch.int32,
    torch.bfloat16: torch.float32,
}


def all_reduce_(hvd: Any, buffer: Tensor, op: Any, world_size: int) -> None:
    """Reduce the contiguous ``buffer`` in place over every process (``op`` from ``resolve_reduce_op``)."""
    if buffer.is_complex():
        if op not in (_MEAN, _ReduceOp.SUM):
            raise ValueError(f"Complex tensors can only be summed or averaged, not reduced with {op}.")
        all_reduce_(hvd, torch.view_as_real(buffer), op, world_size)  # a view: reduced in place
        return
    if buffer.dtype == torch.bool:  # "any" for sum/mean/max, "all" for product/min
        op = _ReduceOp.MIN if op in (_ReduceOp.PRODUCT, _ReduceOp.MIN) else _ReduceOp.MAX
    wire_dtype = _REDUCE_WIRE.get(buffer.dtype)
    wire = buffer if wire_dtype is None else buffer.to(wire_dtype)
    if op == _MEAN:
        hvd.allreduce_(wire, op=hvd.Sum, name=_REDUCE_NAME)
        if wire.is_floating_point():
            wire.div_(world_size)
        else:  # integers keep their dtype, the quotient truncated toward zero, as the other strategies do
            wire.copy_(torch.div(wire, world_size, rounding_mode="trunc"))
    else:
        ops = {_ReduceOp.SUM: hvd.Sum, _ReduceOp.MAX: hvd.Max, _ReduceOp.MIN: hvd.Min, _ReduceOp.PRODUCT: hvd.Product}
        hvd.allreduce_(wire, op=ops[op], name=_REDUCE_NAME)
    if wire is not buffer:
        buffer.copy_(wire != 0 if buffer.dtype == torch.bool else wire)


def all_gather(hvd: Any, tensor: Tensor) -> Tensor:
    """Every process's ``tensor`` stacked into shape ``(world_size, *shape)`` (shapes must match)."""
    tensor = tensor.contiguous().unsqueeze(0)
    if tensor.dtype == torch.bool:
        return hvd.allgather(tensor.to(torch.uint8), name=_GATHER_NAME).bool()  # type: ignore[no-any-return]
    if tensor.dtype == torch.bfloat16:  # bit for bit, as int16
        return hvd.allgather(tensor.view(torch.int16), name=_GATHER_NAME).view(torch.bfloat16)  # type: ignore[no-any-return]
    if tensor.is_complex():
        return torch.view_as_complex(hvd.allgather(torch.view_as_real(tensor), name=_GATHER_NAME))
    return hvd.allgather(tensor, name=_GATHER_NAME)  # type: ignore[no-any-return]
