"""The one place where fabric_lite talks to ``torch.distributed`` collectives.

Strategies call these helpers with flat lists of tensors (collections are walked once, by the caller, through
:mod:`fabric_lite.utilities._tree`). Backend gaps are handled here and nowhere else:

* gloo has no ``AVG`` for integers (and older torch has none at all): ``mean`` is a ``SUM`` followed by a division;
  integer tensors keep their dtype and the quotient is truncated toward zero, exactly as Lightning Fabric does.
* NCCL has no ``bool``: boolean tensors travel as ``uint8`` and come back as ``bool``.

Tensors that share a device and dtype are reduced or gathered through one flat buffer, so a dict of 64 scalars
costs one collective, not 64. There is no barrier before a collective: a collective already synchronises.
"""

from __future__ import annotations

import hashlib
import pickle
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from fabric_lite.utilities.exceptions import InvalidReduceOpError

ReduceOp = dist.ReduceOp
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

# dtypes that travel as raw tensors in ``broadcast``; anything else is pickled.
_DTYPES: tuple[torch.dtype, ...] = tuple(
    getattr(torch, name)
    for name in (
        "float32", "float64", "float16", "bfloat16", "complex64", "complex128", "int8", "int16", "int32",
        "int64", "uint8", "bool", "uint16", "uint32", "uint64", "float8_e4m3fn", "float8_e5m2",
    )
    if isinstance(getattr(torch, name, None), torch.dtype)
)
_DTYPE_CODE = {dtype: code for code, dtype in enumerate(_DTYPES)}
_MAX_HEADER_DIMS = 8
_KIND_OBJECT, _KIND_TENSOR, _KIND_ERROR = 0, 1, 2


def resolve_reduce_op(reduce_op: str | Any | None) -> Any:
    """Turn a user's ``reduce_op`` into a ``ReduceOp`` member, or ``"mean"``.

    Strings are matched case-insensitively (``sum``, ``mean``/``avg``, ``max``, ``min``, ``product``/``prod``);
    ``None`` means ``sum`` (the seed's ``sync_ddp`` contract). ``ReduceOp.AVG`` means ``mean``.
    """
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


def _group_by_device_dtype(tensors: Sequence[Tensor]) -> dict[tuple[torch.device, torch.dtype], list[int]]:
    groups: dict[tuple[torch.device, torch.dtype], list[int]] = {}
    for i, t in enumerate(tensors):
        groups.setdefault((t.device, t.dtype), []).append(i)
    return groups


def _flat_buffer(tensors: Sequence[Tensor]) -> Tensor:
    """A contiguous buffer holding all ``tensors``; the tensor's own storage when there is just one."""
    if len(tensors) == 1 and tensors[0].is_contiguous():
        # ``.data`` mutates the storage without autograd tracking, like ``dist.all_reduce`` itself does
        return tensors[0].data
    return torch.cat([t.detach().reshape(-1) for t in tensors])


def _write_back(buffer: Tensor, tensors: Sequence[Tensor]) -> None:
    if len(tensors) == 1 and buffer.data_ptr() == tensors[0].data_ptr() and tensors[0].is_contiguous():
        return
    offset = 0
    for t in tensors:
        n = t.numel()
        t.data.copy_(buffer[offset:offset + n].view(t.shape))
        offset += n


def all_reduce_(tensors: Sequence[Tensor], reduce_op: Any, group: Any, backend: str) -> None:
    """Reduce ``tensors`` across the ranks of ``group`` in place. ``reduce_op`` comes from :func:`resolve_reduce_op`."""
    if not tensors:
        return
    world_size = dist.get_world_size(group)
    for (_, dtype), indices in _group_by_device_dtype(tensors).items():
        members = [tensors[i] for i in indices]
        buffer = _flat_buffer(members)
        if dtype == torch.bool:
            _all_reduce_bool(buffer, reduce_op, group, backend)
        elif reduce_op == _MEAN:
            _all_reduce_mean(buffer, group, backend, world_size)
        else:
            dist.all_reduce(buffer, op=reduce_op, group=group)
        _write_back(buffer, members)


def _all_reduce_mean(buffer: Tensor, group: Any, backend: str, world_size: int) -> None:
    floating = buffer.is_floating_point() or buffer.is_complex()
    if floating and backend == "nccl":
        dist.all_reduce(buffer, op=ReduceOp.AVG, group=group)
        return
    dist.all_reduce(buffer, op=ReduceOp.SUM, group=group)
    if floating:
        buffer.div_(world_size)
    else:
        # integers keep their dtype and the quotient is truncated toward zero, as in Lightning Fabric
        buffer.copy_(buffer / world_size)


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


# torch >= 2.12 renames all_gather_into_tensor to all_gather_single and deprecates the old name
_all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def _all_gather_flat(output: Tensor, flat: Tensor, group: Any) -> None:
    """Gather the 1-D ``flat`` of every rank into the 1-D ``output`` of ``world_size * flat.numel()`` elements."""
    _all_gather_single(output, flat, group=group)


def _signature(tensors: Sequence[Tensor]) -> list[int]:
    meta = repr([(str(t.dtype), tuple(t.shape)) for t in tensors]).encode()
    digest = hashlib.blake2b(meta, digest_size=16).digest()
    return [len(tensors), int.from_bytes(digest[:8], "little", signed=True),
            int.from_bytes(digest[8:], "little", signed=True)]


def _check_same_shapes(tensors: Sequence[Tensor], group: Any, device: torch.device, what: str) -> None:
    """Raise on every rank, with a per-rank table, when the ranks' tensors differ in count, shape or dtype.

    Costs one small collective. Without it gloo aborts the process in C++ or returns wrong data on uneven input.
    """
    world_size = dist.get_world_size(group)
    local = torch.tensor(_signature(tensors), dtype=torch.int64, device=device)
    gathered = torch.empty(world_size * local.numel(), dtype=torch.int64, device=device)
    _all_gather_flat(gathered, local, group)
    rows = gathered.view(world_size, -1)
    if bool((rows == rows[0]).all()):
        return
    metas: list[Any] = [None] * world_size
    dist.all_gather_object(metas, [(str(t.dtype), tuple(t.shape)) for t in tensors], group=group)
    table = "\n".join(f"  rank {r}: {m}" for r, m in enumerate(metas))
    raise ValueError(
        f"{what} needs tensors of the same shape and dtype on every rank, but they differ:\n{table}\n"
        "Pad the tensors to a common shape first, or gather tensors of different shapes with"
        " fabric_lite.utilities.distributed.gather_all_tensors, which returns a list with one tensor per rank."
    )


class _AllGatherGrad(torch.autograd.Function):
    """All-gather whose backward sends every rank the summed gradient of its own slice."""

    @staticmethod
    def forward(ctx: Any, tensor: Tensor, group: Any) -> Tensor:  # type: ignore[override]
        ctx.group = group
        world_size = dist.get_world_size(group)
        out = torch.empty(world_size * tensor.numel(), dtype=tensor.dtype, device=tensor.device)
        _all_gather_flat(out, tensor.detach().contiguous().reshape(-1), group)
        return out.view(world_size, *tensor.shape)

    @staticmethod
    def backward(ctx: Any, *grad_output: Tensor) -> tuple[Tensor, None]:  # type: ignore[override]
        grad = grad_output[0].contiguous()
        dist.all_reduce(grad, op=ReduceOp.SUM, group=ctx.group)
        return grad[dist.get_rank(ctx.group)], None


def all_gather(tensors: Sequence[Tensor], group: Any, device: torch.device, sync_grads: bool) -> list[Tensor]:
    """Gather each tensor from every rank of ``group`` into a new tensor of shape ``(world_size, *shape)``."""
    _check_same_shapes(tensors, group, device, "all_gather")
    if sync_grads:
        return [_AllGatherGrad.apply(t, group) for t in tensors]
    world_size = dist.get_world_size(group)
    results: list[Tensor | None] = [None] * len(tensors)
    for (dev, dtype), indices in _group_by_device_dtype(tensors).items():
        members = [tensors[i] for i in indices]
        flat = members[0].detach().contiguous().reshape(-1) if len(members) == 1 else _flat_buffer(members)
        out = torch.empty(world_size * flat.numel(), dtype=dtype, device=dev)
        _all_gather_flat(out, flat, group)
        if len(members) == 1:
            results[indices[0]] = out.view(world_size, *members[0].shape)
            continue
        rows = out.view(world_size, -1)
        offset = 0
        for i, t in zip(indices, members):
            n = t.numel()
            results[i] = rows[:, offset:offset + n].reshape(world_size, *t.shape)
            offset += n
    return results  # type: ignore[return-value]


def broadcast(obj: Any, src: int, group: Any, device: torch.device) -> Any:
    """Send ``obj`` from global rank ``src`` to every rank of ``group`` and return it.

    Tensors travel as tensors (a small fixed-size header, then the data, allocated on ``device`` on the receivers);
    everything else is pickled. If ``src`` cannot pickle the object, every rank raises instead of waiting.
    """
    rank = dist.get_rank()
    header = torch.zeros(4 + _MAX_HEADER_DIMS, dtype=torch.int64, device=device)
    payload: Tensor | None = None
    error: BaseException | None = None
    if rank == src:
        if isinstance(obj, Tensor) and obj.dtype in _DTYPE_CODE and obj.dim() <= _MAX_HEADER_DIMS:
            header[0] = _KIND_TENSOR
            header[1] = _DTYPE_CODE[obj.dtype]
            header[2] = obj.dim()
            header[4:4 + obj.dim()] = torch.tensor(obj.shape, dtype=torch.int64)
        else:
            try:
                data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
                header[0] = _KIND_OBJECT
            except Exception as err:  # noqa: BLE001 - any pickling failure must reach the other ranks
                error = err
                data = f"{type(obj).__name__} ({type(err).__name__}: {err})".encode()
                header[0] = _KIND_ERROR
            payload = torch.frombuffer(bytearray(data), dtype=torch.uint8).to(device)
            header[3] = payload.numel()
    dist.broadcast(header, src=src, group=group)
    kind = int(header[0])
    if kind == _KIND_TENSOR:
        if rank == src:
            dist.broadcast(obj.detach().contiguous().to(device), src=src, group=group)
            return obj
        shape = tuple(int(s) for s in header[4:4 + int(header[2])])
        received = torch.empty(shape, dtype=_DTYPES[int(header[1])], device=device)
        dist.broadcast(received, src=src, group=group)
        return received
    if payload is None:
        payload = torch.empty(int(header[3]), dtype=torch.uint8, device=device)
    dist.broadcast(payload, src=src, group=group)
    if kind == _KIND_ERROR:
        message = bytes(payload.cpu().numpy()).decode(errors="replace")
        raise TypeError(
            f"broadcast(src={src}) failed: rank {src} could not pickle the object, a {message}. Broadcast a"
            " tensor or a picklable object (plain Python values, tensors, and collections of them)."
        ) from error
    if rank == src:
        return obj
    return pickle.loads(bytes(payload.cpu().numpy()))


def reduce_boolean_decision(decision: bool, all: bool, group: Any, device: torch.device) -> bool:  # noqa: A002
    """``all(decisions)`` (or ``any`` with ``all=False``) over the ranks, in one collective."""
    count = torch.tensor(int(bool(decision)), dtype=torch.int32, device=device)
    dist.all_reduce(count, op=ReduceOp.SUM, group=group)
    return bool(count == dist.get_world_size(group)) if all else bool(count > 0)
