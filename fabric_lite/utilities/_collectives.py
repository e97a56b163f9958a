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
import struct
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

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
_MAX_HEADER_DIMS = 8
# broadcast's header, in int64 words: kind, dtype code, ndim, flags, payload bytes, then the shape; padded to
# 16 words (128 bytes) so that the payload after it is aligned for every dtype
_NBYTES_AT = 4
_SHAPE_AT = 5
_HEADER_WORDS = 16
_HEADER_BYTES = _HEADER_WORDS * 8
_HEADER_FORMAT = f"<{_HEADER_WORDS}q"
# payloads up to this size travel inside the header message (one collective instead of two)
_INLINE_BYTES = 16 * 1024
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


def reduce_op_name(op: Any) -> str:
    """A readable name for what :func:`resolve_reduce_op` returned (``"sum"``, ``"mean"``, ...)."""
    if op is _MEAN:
        return "mean"
    return str(getattr(op, "name", op)).lower().replace("redoptype.", "")


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
    if len(aliases) == 1 and aliases[0].is_contiguous() and buffer.data_ptr() == aliases[0].data_ptr():
        return
    # one C++ call for the views and one for the copies: slicing per tensor in Python costs microseconds each
    if _same_shape(aliases):
        sources: Sequence[Tensor] = buffer.view(len(aliases), *aliases[0].shape).unbind()
    else:
        sources = _unflatten_dense_tensors(buffer, aliases)  # type: ignore[no-untyped-call]
    torch._foreach_copy_(list(aliases), list(sources))


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
    floating = buffer.is_floating_point() or buffer.is_complex()
    if floating and backend == "nccl":
        dist.all_reduce(buffer, op=ReduceOp.AVG, group=group)
        return
    dist.all_reduce(buffer, op=ReduceOp.SUM, group=group)
    if floating:
        buffer.div_(world_size)
    else:
        # integers keep their dtype and the quotient is truncated toward zero, as in Lightning Fabric (which
        # divides in float32 and so loses precision above 2**24; the integer division here is exact)
        buffer.copy_(torch.div(buffer, world_size, rounding_mode="trunc"))


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


def _describe(tensors: Sequence[Tensor]) -> list[tuple[str, tuple[int, ...]]]:
    return [(str(t.dtype).replace("torch.", ""), tuple(t.shape)) for t in tensors]


def _signature(call: str, groups: Sequence[Sequence[Tensor]]) -> tuple[int, int, int]:
    """A digest of what this rank is about to do: the collective and the dtypes and shapes of its tensors."""
    parts: list[Any] = [call]
    for members in groups:
        first = members[0]
        if _same_shape(members):
            parts.append((str(first.dtype), first.device.type, tuple(first.shape), len(members)))
        else:
            parts.append((str(first.dtype), first.device.type, [tuple(t.shape) for t in members]))
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=16).digest()
    count = sum(len(m) for m in groups)
    return count, int.from_bytes(digest[:8], "little", signed=True), int.from_bytes(digest[8:], "little", signed=True)


class CollectiveMismatchError(ValueError):
    """The ranks called different collectives, or the same one with tensors that differ in shape or dtype.

    Raised on every rank, before any data is exchanged, with one line per rank saying what it called.
    """


# Every checked collective starts with one all-gather of a fixed-size message per rank: the rank's signature
# (32 bytes) and, when they fit, the bytes of its tensors. The size is the same on every rank whatever the
# tensors, so the exchange itself can never mismatch; small reductions and gathers are then complete in this one
# collective (latency dominates small messages: 512 bytes cost what 4 bytes cost), larger ones follow.
_SIGNATURE_BYTES = 32
_SIGNATURE_FORMAT = "<4q"  # count, two 64-bit halves of the digest, payload bytes (or -1)
_MESSAGE_BYTES = 512
_PAYLOAD_BYTES = _MESSAGE_BYTES - _SIGNATURE_BYTES
# the dtypes' bytes are packed largest element first, so that every slice of the message is aligned for its dtype
_NO_PAYLOAD = -1


def _exchange(
    call: str,
    tensors: Sequence[Tensor],
    groups: Sequence[Sequence[Tensor]],
    group: Any,
    device: torch.device,
    payload: Sequence[Tensor] | None,
) -> Tensor | None:
    """All-gather every rank's signature, and ``payload`` (flat buffers, already ordered for alignment) if given
    and small enough. Raise :class:`CollectiveMismatchError` on every rank when the signatures differ.

    Returns the gathered messages' payload part, one row per rank, or ``None`` when the payload did not travel.
    """
    world_size = dist.get_world_size(group)
    nbytes = _NO_PAYLOAD
    if payload is not None:
        nbytes = sum(b.numel() * b.element_size() for b in payload)
        if nbytes > _PAYLOAD_BYTES:
            nbytes = _NO_PAYLOAD
    # built on the host with struct and buffer copies: a handful of small torch ops would cost tens of us
    raw = bytearray(_MESSAGE_BYTES)
    struct.pack_into(_SIGNATURE_FORMAT, raw, 0, *_signature(call, groups), nbytes)
    if nbytes != _NO_PAYLOAD and payload is not None:
        offset = _SIGNATURE_BYTES
        for buffer in payload:
            data = buffer.reshape(-1).view(torch.uint8)
            size = data.numel()
            raw[offset : offset + size] = (data if data.device.type == "cpu" else data.cpu()).numpy().tobytes()
            offset += size
    message = torch.frombuffer(raw, dtype=torch.uint8)
    if device.type != "cpu":
        message = message.to(device)
    gathered = torch.empty(world_size * _MESSAGE_BYTES, dtype=torch.uint8, device=device)
    _all_gather_flat(gathered, message, group)
    rows = gathered.view(world_size, _MESSAGE_BYTES)
    heads = rows[:, :_SIGNATURE_BYTES]
    signatures = (heads if heads.device.type == "cpu" else heads.cpu()).numpy()
    if not (signatures == signatures[0]).all():
        _raise_mismatch(call, tensors, group)
    return None if nbytes == _NO_PAYLOAD else rows[:, _SIGNATURE_BYTES:]


def _raise_mismatch(call: str, tensors: Sequence[Tensor], group: Any) -> None:
    world_size = dist.get_world_size(group)
    calls: list[Any] = [None] * world_size
    dist.all_gather_object(calls, (call, _describe(tensors)), group=group)
    ranks = dist.get_process_group_ranks(group) if group is not None else range(world_size)
    table = "\n".join(f"  rank {r}: {c} on {m}" for r, (c, m) in zip(ranks, calls, strict=True))
    if len({c for c, _ in calls}) > 1:
        raise CollectiveMismatchError(
            f"The ranks called different collectives at the same point:\n{table}\nEvery rank must call the same"
            " collectives, with the same arguments, in the same order (look for a collective inside a branch that"
            " depends on the rank or on rank-local data)."
        )
    name = call.split("(", 1)[0]
    advice = (
        "Pad the tensors to a common shape first, or gather tensors of different shapes with"
        " fabric_lite.utilities.distributed.gather_all_tensors, which returns a list with one tensor per rank."
        if name == "all_gather"
        else "Give every rank tensors of the same shapes and dtypes (e.g. reduce a per-rank sum and count rather"
        " than a per-rank list of values)."
    )
    raise CollectiveMismatchError(
        f"{name} needs tensors of the same shape and dtype on every rank, but they differ:\n{table}\n{advice}"
    )


def check_collective(call: str, tensors: Sequence[Tensor], group: Any, device: torch.device) -> None:
    """Raise :class:`CollectiveMismatchError` on every rank, with a per-rank table, unless every rank of ``group``
    calls the same collective (``call``, e.g. ``"barrier"``) on tensors of the same count, shapes and dtypes.

    Costs one small collective. Without it gloo aborts the process in C++ on tensors of different sizes, and
    silently returns wrong data on tensors of equal size but different shapes.
    """
    groups = _group_by_device_dtype(tensors) if tensors else []
    _exchange(call, tensors, groups, group, device, None)


def _by_element_size(groups: list[list[Tensor]]) -> list[list[Tensor]]:
    if len(groups) == 1:
        return groups
    return sorted(groups, key=lambda members: -members[0].element_size())


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
    if reduce_op is _MEAN:
        if dtype.is_floating_point or dtype.is_complex:
            return total.div_(world_size)
        return torch.div(total, world_size, rounding_mode="trunc")
    return total


def all_reduce_checked(
    tensors: Sequence[Tensor], reduce_op: Any, group: Any, backend: str, device: torch.device, call: str
) -> None:
    """:func:`all_reduce_`, after checking that every rank reduces the same shapes and dtypes with the same op.

    Up to 480 bytes of tensors (e.g. a dict of 64 float32 metrics) travel with the check, in one collective, and
    are reduced locally, identically on every rank; larger ones follow in :func:`all_reduce_`.
    """
    groups = _by_element_size(_group_by_device_dtype(tensors))
    fusable = reduce_op in _FUSED_OPS and all(m[0].dtype in _DTYPE_CODE and not m[0].is_complex() for m in groups)
    buffers: list[Tensor] | None = None
    aliases: list[list[Tensor]] = []
    if fusable and sum(t.numel() * t.element_size() for t in tensors) <= _PAYLOAD_BYTES:
        aliases = [[_alias(t) for t in members] for members in groups]
        buffers = [_flat_buffer(a).to(device) for a in aliases]
    rows = _exchange(call, tensors, groups, group, device, buffers)
    if rows is None or buffers is None:
        all_reduce_(tensors, reduce_op, group, backend)
        return
    world_size = rows.shape[0]
    offset = 0
    for buffer, members in zip(buffers, aliases, strict=True):
        size = buffer.numel() * buffer.element_size()
        values = rows[:, offset : offset + size].view(buffer.dtype)
        offset += size
        reduced = _reduce_rows(values, reduce_op, world_size)
        if len(members) == 1 and members[0].is_contiguous() and buffer.data_ptr() == members[0].data_ptr():
            members[0].view(-1).copy_(reduced)
        else:
            _write_back(reduced.to(members[0].device), members)


def gather_uneven(tensor: Tensor, group: Any) -> list[Tensor]:
    """Gather tensors with the same number of dimensions but any sizes: one per rank, each with its own shape.

    The shapes are gathered first (with the dtypes, so a mismatch raises on every rank), then every tensor is
    padded to the largest size in each dimension, gathered in one collective, and trimmed back.
    """
    world_size = dist.get_world_size(group)
    tensor = tensor.contiguous()
    if tensor.dim() > _MAX_HEADER_DIMS or tensor.dtype not in _DTYPE_CODE:
        raise ValueError(
            f"gather_all_tensors supports up to {_MAX_HEADER_DIMS} dimensions and standard dtypes, got a"
            f" {tensor.dim()}-d tensor of {tensor.dtype}."
        )
    meta = torch.zeros(2 + _MAX_HEADER_DIMS, dtype=torch.int64, device=tensor.device)
    meta[0] = tensor.dim()
    meta[1] = _DTYPE_CODE[tensor.dtype]
    meta[2 : 2 + tensor.dim()] = torch.tensor(tensor.shape, dtype=torch.int64)
    metas = torch.empty(world_size * meta.numel(), dtype=torch.int64, device=tensor.device)
    _all_gather_flat(metas, meta, group)
    rows = metas.view(world_size, -1).cpu()
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
    numel = padded.numel()
    out = torch.empty(world_size * numel, dtype=tensor.dtype, device=tensor.device)
    _all_gather_flat(out, padded.reshape(-1), group)
    gathered = out.view(world_size, *largest)
    return [gathered[r][tuple(slice(0, n) for n in shape)] for r, shape in enumerate(shapes)]


class _AllGatherGrad(torch.autograd.Function):
    """All-gather whose backward sends every rank the summed gradient of its own slice."""

    @staticmethod
    def forward(ctx: Any, tensor: Tensor, group: Any) -> Tensor:
        ctx.group = group
        world_size = dist.get_world_size(group)
        out = torch.empty(world_size * tensor.numel(), dtype=tensor.dtype, device=tensor.device)
        _all_gather_flat(out, tensor.detach().contiguous().reshape(-1), group)
        return out.view(world_size, *tensor.shape)

    @staticmethod
    def backward(ctx: Any, *grad_output: Tensor) -> tuple[Tensor, None]:
        # a copy: all_reduce works in place, and the incoming gradient may be shared with the rest of the graph
        grad = grad_output[0].clone(memory_format=torch.contiguous_format)
        dist.all_reduce(grad, op=ReduceOp.SUM, group=ctx.group)
        return grad[dist.get_rank(ctx.group)], None


def all_gather(tensors: Sequence[Tensor], group: Any, device: torch.device, sync_grads: bool) -> list[Tensor]:
    """Gather each tensor from every rank of ``group`` into a new tensor of shape ``(world_size, *shape)``."""
    if not sync_grads and tensors:
        fused = _all_gather_fused(tensors, group, device)
        if fused is not None:
            return fused
    else:
        check_collective("all_gather", tensors, group, device)
    if sync_grads:
        return [_AllGatherGrad.apply(t, group) for t in tensors]  # type: ignore[no-untyped-call]
    if not tensors:
        return []
    world_size = dist.get_world_size(group)
    results: dict[int, Tensor] = {}
    for members in _group_by_device_dtype(tensors):
        if len(members) == 1:
            flat = members[0].detach().contiguous().reshape(-1)
        else:
            flat = _flat_buffer([t.detach() for t in members])
        out = torch.empty(world_size * flat.numel(), dtype=flat.dtype, device=flat.device)
        _all_gather_flat(out, flat, group)
        if len(members) == 1:
            results[id(members[0])] = out.view(world_size, *members[0].shape)
            continue
        rows = out.view(world_size, -1)
        offset = 0
        for t in members:
            n = t.numel()
            results[id(t)] = rows[:, offset : offset + n].reshape(world_size, *t.shape)
            offset += n
    return [results[id(t)] for t in tensors]


def _all_gather_fused(tensors: Sequence[Tensor], group: Any, device: torch.device) -> list[Tensor] | None:
    """Check the ranks' shapes and, for up to 480 bytes of tensors, gather them in the same collective.

    Returns the gathered tensors, or ``None`` when they did not fit (the check has then passed)."""
    groups = _by_element_size(_group_by_device_dtype(tensors))
    buffers: list[Tensor] | None = None
    if sum(t.numel() * t.element_size() for t in tensors) <= _PAYLOAD_BYTES:
        buffers = [_flat_buffer([t.detach() for t in members]).to(device) for members in groups]
    rows = _exchange("all_gather", tensors, groups, group, device, buffers)
    if rows is None or buffers is None:
        return None
    world_size = rows.shape[0]
    results: dict[int, Tensor] = {}
    offset = 0
    for buffer, members in zip(buffers, groups, strict=True):
        size = buffer.numel() * buffer.element_size()
        values = rows[:, offset : offset + size].view(buffer.dtype)
        offset += size
        start = 0
        for t in members:
            n = t.numel()
            results[id(t)] = values[:, start : start + n].reshape(world_size, *t.shape).to(t.device)
            start += n
    return [results[id(t)] for t in tensors]


def broadcast(obj: Any, src: int, group: Any, device: torch.device) -> Any:
    """Send ``obj`` from global rank ``src`` to every rank of ``group`` and return it.

    One fixed-size message carries a header (what follows: a tensor's dtype, shape and ``requires_grad``, or a
    pickled object's length) and, when it fits, the payload itself. A broadcast of a small tensor or object is
    therefore one collective, as cheap as a raw ``dist.broadcast`` (a message of a few KiB costs the same as a
    few bytes: latency dominates); a larger payload follows in a second broadcast, where bandwidth dominates.
    Tensors (and ``nn.Parameter``) travel as raw bytes, so any dtype works on any backend and nothing is pickled;
    receivers get them on ``device``. If ``src`` cannot pickle the object, every rank raises instead of waiting.
    """
    if dist.get_rank() == src:
        return _broadcast_send(obj, src, group, device)
    message = torch.empty(_HEADER_BYTES + _INLINE_BYTES, dtype=torch.uint8, device=device)
    dist.broadcast(message, src=src, group=group)
    host = message if message.device.type == "cpu" else message.narrow(0, 0, _HEADER_BYTES).cpu()
    header = struct.unpack(_HEADER_FORMAT, host.narrow(0, 0, _HEADER_BYTES).numpy().tobytes())
    kind, nbytes = header[0], header[_NBYTES_AT]
    if nbytes <= _INLINE_BYTES:
        data = message.narrow(0, _HEADER_BYTES, nbytes)
    else:  # too large for the header message: a second broadcast, sized from the header
        data = torch.empty(nbytes, dtype=torch.uint8, device=device)
        dist.broadcast(data, src=src, group=group)
    if kind == _KIND_OBJECT:
        return pickle.loads(data.cpu().numpy().tobytes())
    if kind == _KIND_ERROR:
        _raise_unpicklable(src, data.cpu().numpy().tobytes().decode(errors="replace"), None)
    received = data.view(_DTYPES[header[1]]).reshape(header[_SHAPE_AT : _SHAPE_AT + header[2]]).clone()
    flags = header[3]
    if flags & 2:
        return torch.nn.Parameter(received, requires_grad=bool(flags & 1))
    return received.requires_grad_(bool(flags & 1))


def _broadcast_send(obj: Any, src: int, group: Any, device: torch.device) -> Any:
    header = [0] * _HEADER_WORDS
    error: BaseException | None = None
    if type(obj) in (Tensor, torch.nn.Parameter) and obj.dtype in _DTYPE_CODE and obj.dim() <= _MAX_HEADER_DIMS:
        payload = _as_bytes(obj.detach())
        header[0] = _KIND_TENSOR
        header[1] = _DTYPE_CODE[obj.dtype]
        header[2] = obj.dim()
        header[3] = int(obj.requires_grad) | (int(isinstance(obj, torch.nn.Parameter)) << 1)
        header[_SHAPE_AT : _SHAPE_AT + obj.dim()] = obj.shape
    else:
        try:
            data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
            header[0] = _KIND_OBJECT
        except Exception as err:
            error = err
            data = f"{type(obj).__name__} ({type(err).__name__}: {err})".encode()
            header[0] = _KIND_ERROR
        payload = torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else torch.empty(0, dtype=torch.uint8)
    nbytes = header[_NBYTES_AT] = payload.numel()
    # the message is built on the host: the header packed with struct (far cheaper than writing a tensor
    # element by element), the payload copied in with one copy_
    raw = bytearray(_HEADER_BYTES + _INLINE_BYTES)
    struct.pack_into(_HEADER_FORMAT, raw, 0, *header)
    message = torch.frombuffer(raw, dtype=torch.uint8)
    if nbytes <= _INLINE_BYTES:
        message.narrow(0, _HEADER_BYTES, nbytes).copy_(payload)
    dist.broadcast(message.to(device), src=src, group=group)
    if nbytes > _INLINE_BYTES:
        dist.broadcast(payload.to(device), src=src, group=group)
    if error is not None:
        _raise_unpicklable(src, bytes(raw[_HEADER_BYTES : _HEADER_BYTES + nbytes]).decode(errors="replace"), error)
    return obj


def _raise_unpicklable(src: int, what: str, cause: BaseException | None) -> None:
    raise TypeError(
        f"broadcast(src={src}) failed: rank {src} could not pickle the object, a {what}. Broadcast a"
        " tensor or a picklable object (plain Python values, tensors, and collections of them)."
    ) from cause


def _as_bytes(tensor: Tensor) -> Tensor:
    """A flat uint8 view of ``tensor``'s storage (a copy only if it is not contiguous)."""
    return tensor.contiguous().reshape(-1).view(torch.uint8)


def reduce_boolean_decision(decision: bool, all: bool, group: Any, device: torch.device) -> bool:
    """``all(decisions)`` (or ``any`` with ``all=False``) over the ranks, in one collective."""
    count = torch.tensor(int(bool(decision)), dtype=torch.int32, device=device)
    dist.all_reduce(count, op=ReduceOp.SUM, group=group)
    return bool(count == dist.get_world_size(group)) if all else bool(count > 0)
