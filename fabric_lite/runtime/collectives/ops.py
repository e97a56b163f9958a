"""The plain collectives: reduce ops, the backends' gaps, and the flat buffers every collective here travels in.

The gaps are handled here only: gloo has no integer ``AVG`` (``mean`` is a ``SUM`` and a division, truncated toward zero
for integers, as in Lightning Fabric), NCCL no ``bool`` (booleans travel as ``uint8``). Tensors that share a device and
dtype travel in one flat buffer, so a dict of 64 scalars costs one collective. No barrier precedes a collective: a
collective already synchronises.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from fabric_lite.utilities.exceptions import InvalidReduceOpError
from fabric_lite.utilities.types import ReduceOp as ReduceOp

_MEAN = "mean"

_REDUCE_OP_NAMES: dict[str, Any] = {
    "sum": ReduceOp.SUM,
    "mean": _MEAN,
    "avg": _MEAN,
    "max": ReduceOp.MAX,
    "min": ReduceOp.MIN,
    "product": ReduceOp.PRODUCT,
    "prod": ReduceOp.PRODUCT,
}

# dtypes that travel as raw tensors in ``broadcast`` and ``gather_uneven``'s header; anything else is pickled.
_DTYPES: tuple[torch.dtype, ...] = tuple(
    getattr(torch, name)
    for name in (
        "float32",
        "float64",
        "float16",
        "bfloat16",
        "complex64",
        "complex128",
        "int8",
        "int16",
        "int32",
        "int64",
        "uint8",
        "bool",
        "uint16",
        "uint32",
        "uint64",
        "float8_e4m3fn",
        "float8_e5m2",
    )
    if isinstance(getattr(torch, name, None), torch.dtype)
)
_DTYPE_CODE = {dtype: code for code, dtype in enumerate(_DTYPES)}
# the most dimensions a shape may have in a header (``broadcast``'s, ``gather_uneven``'s)
_MAX_HEADER_DIMS = 8


def resolve_reduce_op(reduce_op: str | Any | None) -> Any:
    """Turn a user's ``reduce_op`` into a ``ReduceOp`` member, or ``"mean"``: a name case-insensitively (``sum``,
    ``mean``/``avg``, ``max``, ``min``, ``product``/``prod``), ``None`` as ``sum`` (as Lightning's ``sync_ddp``),
    ``ReduceOp.AVG`` as ``mean``. Anything else raises :class:`InvalidReduceOpError` naming the choices."""
    if reduce_op is None:
        return ReduceOp.SUM
    if isinstance(reduce_op, str):
        op = _REDUCE_OP_NAMES.get(reduce_op.lower())
        if op is None:
            raise InvalidReduceOpError(
                f"Unknown reduce_op={reduce_op!r}. Choose one of {sorted(_REDUCE_OP_NAMES)} or a"
                " torch.distributed.ReduceOp member, e.g. reduce_op='sum'."
            )
        return op
    if isinstance(reduce_op, (ReduceOp, ReduceOp.RedOpType)):
        return _MEAN if reduce_op == ReduceOp.AVG else reduce_op
    raise InvalidReduceOpError(
        f"reduce_op must be a string or a torch.distributed.ReduceOp, got {reduce_op!r} of type"
        f" {type(reduce_op).__name__}. Choose one of {sorted(_REDUCE_OP_NAMES)}."
    )


def reduce_op_name(op: Any) -> str:
    """A readable name for what :func:`resolve_reduce_op` returned (``"sum"``, ``"mean"``, ...)."""
    return "mean" if op is _MEAN else str(getattr(op, "name", op)).lower().replace("redoptype.", "")


# how a checked all_reduce with each op names itself, worked out once (every op is known in advance)
_REDUCE_CALLS: dict[Any, str] = {
    op: f"all_reduce(reduce_op={reduce_op_name(op)})" for op in (_MEAN, *ReduceOp.RedOpType.__members__.values())
}


def reduce_call(op: Any) -> str:
    """How a checked ``all_reduce`` with ``op`` (from :func:`resolve_reduce_op`) names itself: the call every rank
    must agree on, and what an error shows."""
    try:
        call = _REDUCE_CALLS.get(op)
    except TypeError:  # an unhashable op (a pre-multiplied sum, say): named afresh every time
        call = None
    return call if call is not None else f"all_reduce(reduce_op={reduce_op_name(op)})"


# ---------------------------------------------------------------------------------------------- flat buffers
def _group_by_device_dtype(tensors: Sequence[Tensor]) -> list[list[Tensor]]:
    """The tensors split into groups that share a device and a dtype, in order (usually one group)."""
    first = tensors[0]
    dtype, device = first.dtype, first.device
    if all(t.dtype is dtype for t in tensors) and all(t.device == device for t in tensors[1:]):
        return [list(tensors)]
    groups: dict[tuple[torch.device, torch.dtype], list[Tensor]] = {}
    for t in tensors:
        groups.setdefault((t.device, t.dtype), []).append(t)
    return list(groups.values())


def _by_element_size(groups: list[list[Tensor]]) -> list[list[Tensor]]:
    """``groups`` with the largest elements first, so that buffers packed one after another stay aligned."""
    return groups if len(groups) == 1 else sorted(groups, key=lambda members: -members[0].element_size())


def _alias(t: Tensor) -> Tensor:
    # ``.data`` changes the storage without autograd tracking (no version bump), as ``dist.all_reduce`` does
    return t.data if t.requires_grad else t


def _same_shape(tensors: Sequence[Tensor]) -> bool:
    shape = tensors[0].shape
    return all(t.shape == shape for t in tensors)


def _flat_buffer(aliases: Sequence[Tensor]) -> Tensor:
    """A contiguous buffer holding all tensors (given as :func:`_alias`es); the tensor's own storage for one."""
    if len(aliases) == 1 and aliases[0].is_contiguous():
        return aliases[0]
    if _same_shape(aliases):
        return torch.stack(list(aliases)).reshape(-1)  # one C++ call; the common case (e.g. a dict of scalars)
    flat: Tensor = _flatten_dense_tensors(aliases)  # type: ignore[no-untyped-call]
    return flat


def _write_back(buffer: Tensor, aliases: Sequence[Tensor]) -> None:
    """Copy the flat result ``buffer`` into the tensors (given as :func:`_alias`es), unless it is the one tensor's own
    storage."""
    if len(aliases) == 1 and aliases[0].is_contiguous():
        if buffer.data_ptr() != aliases[0].data_ptr():
            aliases[0].view(-1).copy_(buffer)
        return
    # one C++ call for the views and one for the copies, rather than a Python slice per tensor
    if _same_shape(aliases):
        sources: Sequence[Tensor] = buffer.view(len(aliases), *aliases[0].shape).unbind()
    else:
        sources = _unflatten_dense_tensors(buffer, aliases)  # type: ignore[no-untyped-call]
    torch._foreach_copy_(list(aliases), list(sources))


def _columns(rows: Tensor, buffers: Sequence[Tensor]) -> Iterator[Tensor]:
    """The columns of the gathered bytes ``rows`` (one row per rank) that carried each of ``buffers`` one after
    another, each seen as its buffer's dtype: ``(world_size, numel)``."""
    offset = 0
    for buffer in buffers:
        size = buffer.numel() * buffer.element_size()
        yield rows[:, offset : offset + size].view(buffer.dtype)
        offset += size


def _all_gather_flat(flat: Tensor, group: Any, world_size: int) -> Tensor:
    """Gather the 1-D ``flat`` of every rank of ``group``: ``(world_size, flat.numel())``, one row per rank."""
    output = torch.empty(world_size * flat.numel(), dtype=flat.dtype, device=flat.device)
    # torch >= 2.12 renames all_gather_into_tensor to all_gather_single, deprecating the old name
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    gather(output, flat, group)
    return output.view(world_size, -1)


def _gather_buffers(buffers: Sequence[Tensor], group: Any, world_size: int) -> list[Tensor]:
    """All-gather each buffer (one per device and dtype) flat: ``(world_size, numel)`` each."""
    return [_all_gather_flat(buffer.reshape(-1), group, world_size) for buffer in buffers]


# ---------------------------------------------------------------------------------------------- reductions
def all_reduce_(tensors: Sequence[Tensor], reduce_op: Any, group: Any, backend: str) -> None:
    """Reduce ``tensors`` across the ranks of ``group`` in place. ``reduce_op`` comes from :func:`resolve_reduce_op`."""
    if not tensors:
        return
    world_size = dist.get_world_size(group)
    for members in _group_by_device_dtype(tensors):
        aliases = [_alias(t) for t in members]
        buffer = _flat_buffer(aliases)
        if buffer.dtype == torch.bool:
            _all_reduce_bool(buffer, reduce_op, group, backend)
        elif reduce_op == _MEAN:
            _all_reduce_mean(buffer, group, backend, world_size)
        else:
            dist.all_reduce(buffer, op=reduce_op, group=group)
        _write_back(buffer, aliases)


def _all_reduce_mean(buffer: Tensor, group: Any, backend: str, world_size: int) -> None:
    if (buffer.is_floating_point() or buffer.is_complex()) and backend == "nccl":
        dist.all_reduce(buffer, op=ReduceOp.AVG, group=group)
        return
    dist.all_reduce(buffer, op=ReduceOp.SUM, group=group)
    _divide_(buffer, world_size)


def _divide_(total: Tensor, world_size: int) -> Tensor:
    """``total`` divided by ``world_size`` in place: the mean of a sum over the ranks. Integers keep their dtype and the
    quotient is truncated toward zero, as in Lightning Fabric (which divides in float32 and so loses precision above
    2**24; the integer division here is exact)."""
    if total.is_floating_point() or total.is_complex():
        return total.div_(world_size)
    return total.div_(world_size, rounding_mode="trunc")


# On booleans, sum and mean mean "any" and product means "all"; MAX/MIN express them without overflow.
_BOOL_OPS = {ReduceOp.SUM: ReduceOp.MAX, _MEAN: ReduceOp.MAX, ReduceOp.PRODUCT: ReduceOp.MIN}


def _all_reduce_bool(buffer: Tensor, reduce_op: Any, group: Any, backend: str) -> None:
    op = _BOOL_OPS.get(reduce_op, reduce_op)
    if backend != "nccl":
        dist.all_reduce(buffer, op=op, group=group)
        return
    wire = buffer.to(torch.uint8)  # NCCL has no bool
    dist.all_reduce(wire, op=op, group=group)
    buffer.copy_(wire != 0)


# the ops that a gathered message can be reduced with locally (see _reduce_rows)
_FUSED_OPS = (ReduceOp.SUM, _MEAN, ReduceOp.MAX, ReduceOp.MIN, ReduceOp.PRODUCT)


def _reduce_rows(rows: Tensor, reduce_op: Any, world_size: int) -> Tensor:
    """Reduce ``(world_size, n)`` rows over the ranks, as the collective would (the same on every rank)."""
    dtype = rows.dtype
    if dtype == torch.bool:
        reduce_op = _BOOL_OPS.get(reduce_op, reduce_op)
    if reduce_op == ReduceOp.MAX:
        return rows.amax(0)
    if reduce_op == ReduceOp.MIN:
        return rows.amin(0)
    if reduce_op == ReduceOp.PRODUCT:
        return rows.prod(0, dtype=dtype)
    total = rows.sum(0, dtype=dtype)
    return _divide_(total, world_size) if reduce_op is _MEAN else total


def reduce_boolean_decision(decision: bool, all: bool, group: Any, device: torch.device) -> bool:
    """``all(decisions)`` (or ``any`` with ``all=False``) over the ranks, in one collective."""
    count = torch.tensor(int(bool(decision)), dtype=torch.int32, device=device)
    dist.all_reduce(count, op=ReduceOp.SUM, group=group)
    return bool(count == dist.get_world_size(group)) if all else bool(count > 0)
