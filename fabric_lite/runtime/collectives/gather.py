"""Gathers: checked gathers of same-shaped tensors (fused into the check for small ones), the differentiable
all-gather, and gathers of tensors whose sizes differ between ranks."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from fabric_lite.runtime.collectives.checked import GroupState, _exchange, _grouped, _payload, check_collective
from fabric_lite.runtime.collectives.ops import (
    _DTYPE_CODE,
    _DTYPES,
    _MAX_HEADER_DIMS,
    ReduceOp,
    _all_gather_flat,
    _columns,
    _flat_buffer,
    _gather_buffers,
    _group_by_device_dtype,
)


def all_gather_checked(
    tensors: Sequence[Tensor],
    group: GroupState,
    device: torch.device,
    sync_grads: bool,
    grouped: tuple[list[list[Tensor]], tuple[int, int, int]] | None = None,
) -> list[Tensor]:
    """Gather each tensor from every rank of ``group`` into a new ``(world_size, *shape)`` tensor, after checking that
    every rank gathers the same shapes and dtypes (up to 480 bytes travel with the check). ``sync_grads``:
    differentiable results; ``grouped``: ``_grouped``'s answer, where the caller has it."""
    if sync_grads or not tensors:
        check_collective("all_gather", tensors, group.group, device, group.check_group)
        return _gather_after_check(tensors, group, sync_grads)
    groups, signature = grouped or _grouped(group, "all_gather", tensors)
    payload = _payload(tensors, groups, device)
    buffers = payload[1] if payload is not None else None
    rows = _exchange("all_gather", tensors, signature, group.group, device, buffers, group.check_group)
    if rows is None or buffers is None:
        return _gather_after_check(tensors, group, False)
    # the gathered tensors, cut from the exchanged rows that carried every rank's buffers
    outs = [values.to(m[0].device) for values, m in zip(_columns(rows, buffers), groups, strict=True)]
    return _split_gathered(tensors, groups, outs, rows.shape[0])


def _gather_after_check(tensors: Sequence[Tensor], group: GroupState, sync_grads: bool) -> list[Tensor]:
    """Gather ``tensors``, which every rank was checked to hold alike: one collective per device and dtype."""
    if sync_grads:
        return [_AllGatherGrad.apply(t, group.group) for t in tensors]  # type: ignore[no-untyped-call]
    if not tensors:
        return []
    groups = _group_by_device_dtype(tensors)
    outs = _gather_buffers(
        [_flat_buffer([t.detach() for t in members]) for members in groups], group.group, group.world_size
    )
    return _split_gathered(tensors, groups, outs, group.world_size)


def _split_gathered(
    tensors: Sequence[Tensor], groups: Sequence[Sequence[Tensor]], outs: Sequence[Tensor], world_size: int
) -> list[Tensor]:
    results: dict[int, Tensor] = {}
    for members, rows in zip(groups, outs, strict=True):
        if len(members) == 1:
            results[id(members[0])] = rows.reshape(world_size, *members[0].shape)
            continue
        offset = 0
        for t in members:
            n = t.numel()
            results[id(t)] = rows[:, offset : offset + n].reshape(world_size, *t.shape)
            offset += n
    return [results[id(t)] for t in tensors]


class _AllGatherGrad(torch.autograd.Function):
    """All-gather whose backward sends every rank the summed gradient of its own slice."""

    @staticmethod
    def forward(ctx: Any, tensor: Tensor, group: Any | None = None) -> Tensor:
        ctx.group = group
        world_size = dist.get_world_size(group)
        rows = _all_gather_flat(tensor.detach().contiguous().reshape(-1), group, world_size)
        return rows.view(world_size, *tensor.shape)

    @staticmethod
    def backward(ctx: Any, *grad_output: Tensor) -> tuple[Tensor, None]:
        # a copy: all_reduce works in place, and the incoming gradient may be shared with the rest of the graph
        grad = grad_output[0].clone(memory_format=torch.contiguous_format)
        dist.all_reduce(grad, op=ReduceOp.SUM, group=ctx.group)
        return grad[dist.get_rank(ctx.group)], None


def gather_uneven(tensor: Tensor, group: Any) -> list[Tensor]:
    """Gather one tensor per rank, each with its own sizes: the shapes are gathered first (a different ``ndim`` or dtype
    raises ``ValueError`` on every rank), then the tensors, padded to the largest size, in one collective, and trimmed
    back."""
    world_size = dist.get_world_size(group)
    tensor = tensor.contiguous()
    if tensor.dim() > _MAX_HEADER_DIMS or tensor.dtype not in _DTYPE_CODE:
        raise ValueError(
            f"gather_all_tensors supports up to {_MAX_HEADER_DIMS} dimensions and standard dtypes, got a"
            f" {tensor.dim()}-d tensor of {tensor.dtype}."
        )
    # ndim, dtype code, then the shape, padded to the longest shape a header holds
    meta = [tensor.dim(), _DTYPE_CODE[tensor.dtype], *tensor.shape, *[0] * (_MAX_HEADER_DIMS - tensor.dim())]
    rows = _all_gather_flat(torch.tensor(meta, dtype=torch.int64, device=tensor.device), group, world_size).cpu()
    if bool((rows[:, :2] != rows[0, :2]).any()):
        ranks = dist.get_process_group_ranks(group) if group is not None else range(world_size)
        table = "\n".join(
            f"  rank {r}: {int(row[0])}-d {_DTYPES[int(row[1])]}" for r, row in zip(ranks, rows, strict=True)
        )
        raise ValueError(
            "gather_all_tensors needs tensors with the same number of dimensions and the same dtype on every rank,"
            f" but they differ:\n{table}\nReshape or cast them to agree first."
        )
    ndim = tensor.dim()
    shapes = [tuple(int(v) for v in row[2 : 2 + ndim]) for row in rows]
    largest = tuple(max(shape[d] for shape in shapes) for d in range(ndim))
    padded = torch.zeros(largest, dtype=tensor.dtype, device=tensor.device)
    padded[tuple(slice(0, n) for n in tensor.shape)] = tensor
    gathered = _all_gather_flat(padded.reshape(-1), group, world_size).view(world_size, *largest)
    return [gathered[r][tuple(slice(0, n) for n in shape)] for r, shape in enumerate(shapes)]
