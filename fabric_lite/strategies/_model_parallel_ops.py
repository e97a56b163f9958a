"""Helpers of ``ModelParallelStrategy``: mesh shape, and norms and optimizer settings over mixed DTensors."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from torch.nn import Module
from torch.optim import Optimizer


class MeshSizeError(ValueError, RuntimeError):
    """Mesh sizes that do not multiply to the world size: a ``ValueError`` that is also Lightning's ``RuntimeError``."""


def mesh_shape(
    data_parallel: int | str,
    tensor_parallel: int | str,
    replicate: int,
    world_size: int,
    num_nodes: int,
    pipeline: int = 1,
) -> tuple[int, ...]:
    """The mesh shape for the sizes asked (``"auto"``: data parallel across nodes, tensor parallel within one), with
    the pipeline dimension first where ``pipeline > 1``; :class:`MeshSizeError`, showing the arithmetic, where they
    do not fit the world size."""
    world = f"world size ({world_size} = {num_nodes} node(s) x {world_size // max(num_nodes, 1)} device(s))"
    if pipeline == 1:
        return _inner_shape(data_parallel, tensor_parallel, replicate, world_size, num_nodes, world)
    if world_size % pipeline:
        raise MeshSizeError(
            f"ModelParallelStrategy: pipeline_parallel_size ({pipeline}) must divide the {world}. Choose a pipeline"
            " size that divides it."
        )
    # the pipeline dimension is outermost: where it divides the nodes, each stage's ranks span num_nodes / pipeline
    nodes = num_nodes // pipeline if num_nodes % pipeline == 0 else 1
    stage = f"ranks of one pipeline stage ({world_size // pipeline} = world size {world_size} / pipeline {pipeline})"
    return (pipeline, *_inner_shape(data_parallel, tensor_parallel, replicate, world_size // pipeline, nodes, stage))


def _inner_shape(
    data_parallel: int | str,
    tensor_parallel: int | str,
    replicate: int,
    world_size: int,
    num_nodes: int,
    scope: str,
) -> tuple[int, ...]:
    """The data-parallel (with HSDP: replicate, shard) and tensor-parallel sizes for ``world_size`` ranks, which
    ``scope`` describes in an error."""
    if data_parallel == "auto" and tensor_parallel == "auto":
        data_parallel, tensor_parallel = num_nodes, world_size // max(num_nodes, 1)
    elif data_parallel == "auto" and isinstance(tensor_parallel, int):
        data_parallel = world_size // tensor_parallel if world_size % tensor_parallel == 0 else 0
    elif tensor_parallel == "auto" and isinstance(data_parallel, int):
        tensor_parallel = world_size // data_parallel if world_size % data_parallel == 0 else 0
    assert isinstance(data_parallel, int) and isinstance(tensor_parallel, int)
    if data_parallel * tensor_parallel != world_size or not data_parallel or not tensor_parallel:
        product = f", not {data_parallel * tensor_parallel}" if data_parallel and tensor_parallel else ""
        raise MeshSizeError(
            f"ModelParallelStrategy: the sizes data_parallel_size ({data_parallel or 'no whole number'}) and"
            f" tensor_parallel_size ({tensor_parallel or 'no whole number'}) multiplied should equal the {scope}"
            f"{product}. Choose sizes whose product is that number, or leave one of them 'auto'."
        )
    if data_parallel % replicate:
        raise MeshSizeError(
            f"ModelParallelStrategy: data_parallel_replicate_size ({replicate}) must divide data_parallel_size"
            f" ({data_parallel}), which here is {world_size} ranks / {tensor_parallel} tensor-parallel."
        )
    if replicate == 1:
        return (data_parallel, tensor_parallel)
    return (replicate, data_parallel // replicate, tensor_parallel)


def combine_norms(norm: Tensor, norm_type: float, mesh: Any) -> Tensor:
    """The ``norm_type``-norm over every rank of ``mesh`` (a 1-D mesh) of each rank's ``norm``: the ranks of a
    pipeline hold different layers. Every rank of the mesh must call it."""
    import torch.distributed as dist

    group = mesh.get_group()
    if norm_type == float("inf"):
        dist.all_reduce(norm, op=dist.ReduceOp.MAX, group=group)
        return norm
    total = norm.double() ** norm_type
    dist.all_reduce(total, group=group)
    return (total ** (1.0 / norm_type)).to(norm.dtype)


def move_leftovers(module: Module, device: torch.device) -> None:
    """Move the plain parameters and buffers ``parallelize_fn`` left where the model was built to ``device``."""
    from torch.distributed.tensor import DTensor

    for sub in module.modules():
        for param in sub._parameters.values():
            if param is not None and not isinstance(param, DTensor) and param.device != device:
                param.data = param.data.to(device)
        for name, buffer in sub._buffers.items():
            if buffer is not None and not isinstance(buffer, DTensor) and buffer.device != device:
                sub._buffers[name] = buffer.to(device)


def settle_foreach(optimizer: Optimizer, names: dict[int, str]) -> None:
    """Set ``foreach=None`` to ``False`` in each parameter group that mixes DTensors and plain tensors, which
    torch's foreach and fused kernels refuse; ``names`` maps ``id(parameter)`` to its name, for the message.

    Raises:
        ValueError: such a group asks for ``foreach=True`` or ``fused=True``.
    """
    from torch.distributed.tensor import DTensor

    for index, group in enumerate(optimizer.param_groups):
        params = group["params"]
        plain = [p for p in params if not isinstance(p, DTensor)]
        if not plain or len(plain) == len(params):
            continue
        for option in ("foreach", "fused"):
            if group.get(option) is True:
                shown = ", ".join(names.get(id(p), f"<{tuple(p.shape)} tensor>") for p in plain[:3])
                more = f" and {len(plain) - 3} more" if len(plain) > 3 else ""
                raise ValueError(
                    f"{type(optimizer).__name__}({option}=True): parameter group {index} mixes"
                    f" {len(params) - len(plain)} DTensor parameter(s) with {len(plain)} plain tensor parameter(s)"
                    f" ({shown}{more}), which torch's {option} kernels cannot combine (\"got mixed torch.Tensor and"
                    f' DTensor"). Pass {option}=False (or leave it unset), or make every parameter a DTensor:'
                    " parallelize_transformer(..., sequence_parallel=True) parallelises the norms too."
                )
        if "foreach" in group and group["foreach"] is None:
            group["foreach"] = False


def like_groups(parameters: list[Tensor]) -> list[list[Tensor]]:
    """``parameters`` grouped by their gradient's kind: plain tensors, or DTensors by mesh (foreach kernels and norms
    take one mesh at a time)."""
    from torch.distributed.tensor import DTensor

    groups: dict[Any, list[Tensor]] = {}
    for param in parameters:
        grad = param.grad
        key = grad.device_mesh if isinstance(grad, DTensor) else None  # placements may differ within a group
        groups.setdefault(key, []).append(param)
    return list(groups.values())


def total_norm(groups: list[list[Tensor]], norm_type: float) -> Tensor:
    """The ``norm_type``-norm of every group's gradients together, a plain tensor equal on every rank."""
    from torch.distributed.tensor import DTensor

    if not groups:
        return torch.tensor(0.0)
    norms = []
    for group in groups:
        grads = [p.grad for p in group if p.grad is not None]
        norm = torch.nn.utils.get_total_norm(grads, norm_type)  # one DTensor (a partial norm) for a DTensor group
        norms.append(norm.full_tensor() if isinstance(norm, DTensor) else norm)
    device = norms[0].device
    total: Tensor = torch.linalg.vector_norm(torch.stack([n.to(device, torch.float32) for n in norms]), norm_type)
    return total
