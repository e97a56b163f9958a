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

import ctypes
import hashlib
import math
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


_REDUCE_CALLS: dict[Any, str] = {}


def reduce_call(op: Any) -> str:
    """How a checked ``all_reduce`` with ``op`` (from :func:`resolve_reduce_op`) names itself: the call every rank
    must agree on, and what an error shows."""
    try:
        call = _REDUCE_CALLS.get(op)
    except TypeError:  # an unhashable op (a pre-multiplied sum, say): named afresh every time
        return f"all_reduce(reduce_op={reduce_op_name(op)})"
    if call is None:
        call = _REDUCE_CALLS[op] = f"all_reduce(reduce_op={reduce_op_name(op)})"
    return call


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
    check_group = _CHECK_GROUPS.get(id(_resolve(group)))
    if check_group is not None:  # device tensors: the signatures travel on the host, the data stay where they are
        group, device, payload = check_group[1], torch.device("cpu"), None
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


def check_collective(
    call: str, tensors: Sequence[Tensor], group: Any, device: torch.device, predict: bool | None = None
) -> None:
    """Raise :class:`CollectiveMismatchError` on every rank, with a per-rank table, unless every rank of ``group``
    calls the same collective (``call``, e.g. ``"barrier"``) on tensors of the same count, shapes and dtypes.

    Costs one small collective. Without it gloo aborts the process in C++ on tensors of different sizes, and
    silently returns wrong data on tensors of equal size but different shapes.
    """
    groups = _by_element_size(_group_by_device_dtype(tensors)) if tensors else []
    plan = _Plan(_signature(call, groups), "check", None, (), "")
    with _Agreement(group, plan, predict) as call_state:
        if call_state.predicted is not None:
            _run_poisoned(call_state.predicted, group)
        _exchange(call, tensors, groups, group, device, None)


def _run_poisoned(plan: _Plan, group: Any) -> None:
    """Take part in the predicted collective without real data (this rank calls something else): see _History."""
    if plan.kind == "all_gather":
        _gather_planned(_poisoned(plan), group)
    else:
        _reduce_planned(plan, _poisoned(plan), None, group)


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
    tensors: Sequence[Tensor],
    reduce_op: Any,
    group: Any,
    backend: str,
    device: torch.device,
    call: str,
    predict: bool | None = None,
) -> None:
    """:func:`all_reduce_`, after checking that every rank reduces the same shapes and dtypes with the same op.

    When every rank's history predicts this call (see :class:`_History`), the data travel at once, in the backend's
    own collective, and the check costs nothing more; otherwise one small all-gather checks the signatures first,
    carrying up to 480 bytes of tensors (reduced locally, identically on every rank), and larger ones follow.
    ``predict=False`` (debug mode, where every collective is checked by the fixed exchange) never predicts; ``None``
    means :data:`predicting`.
    """
    groups, plan = _planned(call, "all_reduce", reduce_op, backend, tensors)
    consumed = False
    with _Agreement(group, plan, predict) as call_state:
        predicted = call_state.predicted
        if predicted is not None:
            if predicted.key == plan.key:
                aliases = [[_alias(t) for t in members] for members in groups]
                if _reduce_planned(plan, [_flat_buffer(a) for a in aliases], aliases, group):
                    call_state.hit = True
                    return
                consumed = True  # reduced already: the probe only says that a value is not finite, or a mismatch
            else:
                _run_poisoned(predicted, group)
        fusable = reduce_op in _FUSED_OPS and all(m[0].dtype in _DTYPE_CODE and not m[0].is_complex() for m in groups)
        buffers: list[Tensor] | None = None
        aliases = []
        if not consumed and fusable and sum(t.numel() * t.element_size() for t in tensors) <= _PAYLOAD_BYTES:
            aliases = [[_alias(t) for t in members] for members in groups]
            buffers = [_flat_buffer(a).to(device) for a in aliases]
        rows = _exchange(call, tensors, groups, group, device, buffers)
    if consumed:
        return  # every rank matched the prediction (the signatures agree), so the reduction that ran is the result
    if rows is None or buffers is None:
        all_reduce_(tensors, reduce_op, group, backend)
        return
    world_size = rows.shape[0]
    offset = 0
    for buffer, members in zip(buffers, aliases, strict=True):
        size = buffer.numel() * buffer.element_size()
        values = rows[:, offset : offset + size].view(buffer.dtype)
        offset += size
        _store(_reduce_rows(values, reduce_op, world_size).to(members[0].device), buffer, members)


# ---------------------------------------------------------------------------------------------- predicted calls
# A training loop calls the same collectives with the same shapes over and over. Every rank keeps the same history
# of the calls that every rank agreed on (it changes only after a call that succeeded, or failed, on every rank), so
# every rank predicts the same next call: the one that followed the previous call last time. When a prediction
# exists, every rank runs the predicted collective at once, with its own tensors if its call is the predicted one,
# and otherwise with a buffer of the predicted sizes filled with a value that cannot come out of real data
# unnoticed (NaN for float sums and products, +inf for max, -inf for min, and an integer dtype's largest and
# smallest value for its max and min: each absorbs every other value; see _mark). So the sizes agree on every rank
# whatever each rank called (gloo aborts the process when they do not), and one element of the result (the "probe")
# says whether every rank took part with real data. If it is not the mark, they did, and the call cost exactly the
# backend's collective. If it is, every rank falls back to the fixed exchange of signatures, which either raises the
# mismatch on every rank or, when the signatures agree, shows that the value was real (a NaN in the data, say) and
# the result stands. Integer sums, means and products and every boolean reduction have no such value: a flag
# travels beside their data instead (an 8-byte word appended to a gathered message, or a one-element all-reduce of
# its own beside the data's, whose result equals a known value only when every rank sent real data: see _flag), so
# a dirty flag always means a mismatch. Only tensors on the CPU over gloo are predicted (a probe read on the host
# would synchronise a device), and all-gathers only of floats; other calls take the exchange first. The ranks'
# tensors are undefined after a mismatch error, as the error says.

#: whether checked collectives may be predicted; off in debug mode, where every collective takes the fixed exchange
#: (set for the process by ``ParallelStrategy``, so that helpers such as ``all_gather_ddp_if_available`` agree)
predicting = True
_START = (0, 0, 0)
_MAX_HISTORY = 256
_POISON = {ReduceOp.SUM: math.nan, _MEAN: math.nan, ReduceOp.PRODUCT: math.nan, ReduceOp.MAX: math.inf}
_POISON[ReduceOp.MIN] = -math.inf
_FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
# dtypes whose predicted reductions carry a flag (see _reduce_planned): wide enough that a sum of one per rank cannot
# wrap around, or booleans (reduced with max or min)
_FLAGGED = (torch.int32, torch.int64, torch.bool)
# integers do have values that absorb every other under max and min, their dtype's largest and smallest: those
# reductions are marked in the buffer as floats are (a real extreme in the probe costs the exchange, as a real NaN does)
_INT_WORDS = {torch.int32: ctypes.c_int32, torch.int64: ctypes.c_int64}
# gathering and reducing locally beats gloo's all-reduce up to this many gathered bytes (measured on 2 and 3 CPU ranks:
# an all-gather and a local sum took 0.56-0.81x the all-reduce for payloads of 64-512 KiB on 2 ranks and 0.57-0.64x
# for 64-256 KiB on 3, and 1.09x / 1.46x for 1 MiB); a single float element is the exception (gloo's all-reduce of
# one element skips its ring)
_LOCAL_REDUCE_BYTES = 1 << 20


class _Plan:
    """A checked collective as every rank sees it: its signature, kind, reduce op and flat buffers."""

    __slots__ = ("backend", "flagged", "key", "kind", "layout", "nbytes", "numel", "op", "predictable")

    def __init__(
        self, key: tuple[int, int, int], kind: str, op: Any, layout: tuple[tuple[torch.dtype, int], ...], backend: str
    ) -> None:
        self.key = key
        self.kind = kind
        self.op = op
        self.layout = layout
        self.backend = backend
        self.numel = sum(numel for _, numel in layout)
        self.nbytes = sum(numel * dtype.itemsize for dtype, numel in layout)
        floats = all(dtype in _FLOATS for dtype, _ in layout)
        # booleans, and integers under sum, mean and product, have no value that absorbs every other: a flag travels
        # beside them instead
        marked = all(_mark(op, dtype) is not None for dtype, _ in layout) if kind == "all_reduce" else floats
        self.flagged = not marked
        self.predictable = (
            backend == "gloo"
            and bool(layout)
            and all(numel > 0 for _, numel in layout)
            and (
                (kind == "all_gather" and floats)
                or (kind == "all_reduce" and op in _POISON and all(d in _FLOATS + _FLAGGED for d, _ in layout))
            )
        )


# (call, backend, the tensors' dtypes, devices and shapes) -> (the tensors' grouping, as indices, and the plan): both
# depend on nothing else, so a loop that repeats its calls computes the signature (tens of microseconds) once
_PLANS: dict[tuple[Any, ...], tuple[list[list[int]], _Plan]] = {}
_MAX_PLANS = 1024


def _planned(
    call: str, kind: str, op: Any, backend: str, tensors: Sequence[Tensor]
) -> tuple[list[list[Tensor]], _Plan]:
    """The tensors grouped by device and dtype (largest elements first), and the call's plan."""
    key = (call, backend, *[(t.dtype, t.device, t.shape) for t in tensors])
    entry = _PLANS.get(key)
    if entry is None:
        groups = _by_element_size(_group_by_device_dtype(tensors))
        position = {id(t): i for i, t in enumerate(tensors)}
        indices = [[position[id(t)] for t in members] for members in groups]
        if len(_PLANS) >= _MAX_PLANS:
            _PLANS.clear()
        entry = _PLANS[key] = (indices, _Plan(_signature(call, groups), kind, op, _layout(groups), backend))
        return groups, entry[1]
    indices, plan = entry
    if len(indices) == 1 and len(indices[0]) == len(tensors):
        return [list(tensors)], plan
    return [[tensors[i] for i in members] for members in indices], plan


def _layout(groups: Sequence[Sequence[Tensor]]) -> tuple[tuple[torch.dtype, int], ...]:
    if any(m[0].device.type != "cpu" for m in groups):
        return ()  # device tensors: the probe would synchronise the device with the host
    return tuple((m[0].dtype, sum(t.numel() for t in m)) for m in groups)


class _History:
    """The calls every rank of one process group agreed on, as "which call followed which"."""

    __slots__ = ("hits", "last", "next")

    def __init__(self) -> None:
        self.last: tuple[int, int, int] = _START
        self.next: dict[tuple[int, int, int], _Plan] = {}
        self.hits = 0  # calls that took the predicted path and needed nothing else (for tests and benchmarks)

    def predicted(self) -> _Plan | None:
        plan = self.next.get(self.last)
        return plan if plan is not None and plan.predictable else None

    def advance(self, plan: _Plan, hit: bool = False) -> None:
        self.hits += hit
        if len(self.next) >= _MAX_HISTORY and self.last not in self.next:
            self.next.clear()
        self.next[self.last] = plan
        self.last = plan.key

    def forget(self) -> None:
        self.next.clear()
        self.last = _START


_HISTORIES: dict[int, tuple[Any, _History]] = {}
# process group -> (the group, a gloo group of the same ranks that carries its checks on the host)
_CHECK_GROUPS: dict[int, tuple[Any, Any]] = {}


def _resolve(group: Any) -> Any:
    return group if group is not None else dist.group.WORLD


def use_host_checks(group: Any, check_group: Any) -> None:
    """Send the signatures of ``group``'s checked collectives through ``check_group`` (a gloo group of the same
    ranks), built on the host from the tensors' metadata: for NCCL, where a check on the device would make the host
    wait for the GPU twice a call. The data still travel on ``group``, and no payload travels with the check."""
    pg = _resolve(group)
    _CHECK_GROUPS[id(pg)] = (pg, check_group)


def host_check_group(group: Any) -> Any | None:
    """The gloo group that carries ``group``'s checks (see :func:`use_host_checks`), or ``None``."""
    entry = _CHECK_GROUPS.get(id(_resolve(group)))
    return entry[1] if entry is not None else None


def _history(group: Any) -> _History:
    pg = _resolve(group)
    entry = _HISTORIES.get(id(pg))
    if entry is None or entry[0] is not pg:
        entry = _HISTORIES[id(pg)] = (pg, _History())
    return entry[1]


_SIZES: dict[int, tuple[Any, int]] = {}


def _world_size(group: Any) -> int:
    """``dist.get_world_size(group)``, looked up once per group (the lookup costs microseconds, and the checked
    collectives ask on every call)."""
    pg = _resolve(group)
    entry = _SIZES.get(id(pg))
    if entry is None or entry[0] is not pg:
        entry = _SIZES[id(pg)] = (pg, dist.get_world_size(pg))
    return entry[1]


def predicted_calls(group: Any = None) -> int:
    """How many checked collectives on ``group`` so far took the predicted path (one collective, nothing else)."""
    return _history(group).hits


def forget_histories() -> None:
    """Drop every process group's history of calls and host check group (when the process groups are destroyed)."""
    _HISTORIES.clear()
    _CHECK_GROUPS.clear()
    _SIZES.clear()
    _BROADCASTS.clear()


class _Agreement:
    """Around one checked call: ``predicted`` is the plan every rank predicts (``None`` without one, or when not
    predicting); on leaving, ``plan`` is recorded as agreed by every rank, or the history is forgotten when the call
    raised (on every rank: a mismatch) or failed (the job ends). A class rather than a generator-based context
    manager: it is entered on every checked collective, and costs a fraction of one."""

    __slots__ = ("history", "hit", "plan", "predicted")

    def __init__(self, group: Any, plan: _Plan, predict: bool | None) -> None:
        self.plan = plan
        self.history = _history(group) if (predicting if predict is None else predict) else None
        self.predicted = self.history.predicted() if self.history is not None else None
        self.hit = False  # the predicted collective was the whole call

    def __enter__(self) -> _Agreement:
        return self

    def __exit__(self, kind: type[BaseException] | None, *_: object) -> None:
        if self.history is None:
            return
        if kind is not None:
            self.history.forget()
        else:
            self.history.advance(self.plan, hit=self.hit)


def _mark(op: Any, dtype: torch.dtype) -> float | int | None:
    """The value that marks a rank without real data in a predicted reduction with ``op`` of ``dtype``: one that
    absorbs every other (NaN for float sums and products, the largest value for max, the smallest for min), or
    ``None`` where the dtype has none (a flag travels instead)."""
    if dtype in _FLOATS:
        return _POISON.get(op)
    if dtype in _INT_WORDS and op in (ReduceOp.MAX, ReduceOp.MIN):
        info = torch.iinfo(dtype)
        return info.max if op == ReduceOp.MAX else info.min
    return None


def _poisoned(plan: _Plan) -> list[Tensor]:
    if plan.flagged:  # the flag marks these, whatever they hold
        return [torch.zeros(numel, dtype=dtype) for dtype, numel in plan.layout]
    if plan.kind == "all_gather":
        return [torch.full((numel,), math.nan, dtype=dtype) for dtype, numel in plan.layout]
    return [torch.full((numel,), _mark(plan.op, dtype), dtype=dtype) for dtype, numel in plan.layout]  # type: ignore[arg-type]


def _flag(op: Any, dtype: torch.dtype, real: bool, world_size: int) -> tuple[int, int]:
    """The flag a rank sends with a predicted integer or boolean reduction with ``op``: (what this rank sends,
    what the reduced flag is when every rank sent real data). A rank that takes part without real data sends a
    value that the reduction cannot turn into the expected one."""
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


def _first_is_finite(buffer: Tensor) -> bool:
    """Whether the first element of the float CPU tensor ``buffer`` is finite, read from its memory (the probe of a
    predicted call: indexing a tensor and ``item()`` cost about 5 us, this well under one)."""
    word, exponent = _EXPONENT_BITS[buffer.dtype]
    return word.from_address(buffer.data_ptr()).value & exponent != exponent


def _rows_start_finite(rows: Tensor) -> bool:
    """Whether the first element of every row of the 2-D float CPU tensor ``rows`` is finite (every rank's probe in
    a gathered message), read from memory as :func:`_first_is_finite` does."""
    word, exponent = _EXPONENT_BITS[rows.dtype]
    base, step = rows.data_ptr(), rows.stride(0) * rows.element_size()
    return all(word.from_address(base + r * step).value & exponent != exponent for r in range(rows.shape[0]))


def _rows_start_clean(rows: Tensor, op: Any) -> bool:
    """Whether no row of the 2-D CPU tensor ``rows`` (float, or an integer reduced with max or min) starts with the
    mark of a rank without real data (see :func:`_mark`)."""
    word = _INT_WORDS.get(rows.dtype)
    if word is None:
        return _rows_start_finite(rows)
    mark, base, step = _mark(op, rows.dtype), rows.data_ptr(), rows.stride(0) * rows.element_size()
    return all(word.from_address(base + r * step).value != mark for r in range(rows.shape[0]))


def _first_is_clean(buffer: Tensor, op: Any) -> bool:
    """Whether the first element of the reduced CPU tensor ``buffer`` is not the mark of :func:`_mark`."""
    word = _INT_WORDS.get(buffer.dtype)
    if word is None:
        return _first_is_finite(buffer)
    return bool(word.from_address(buffer.data_ptr()).value != _mark(op, buffer.dtype))


def _reduce_planned(plan: _Plan, buffers: list[Tensor], aliases: list[list[Tensor]] | None, group: Any) -> bool:
    """Run ``plan``'s reduction on ``buffers`` (written back into ``aliases`` when given); whether the probe is clean.

    Small payloads are all-gathered and reduced locally (cheaper than gloo's all-reduce, see ``_LOCAL_REDUCE_BYTES``),
    larger ones go through the backend's all-reduce; the choice depends on the plan only, so every rank makes it."""
    world_size = _world_size(group)
    total = plan.nbytes
    clean = True
    if (plan.numel > 1 or plan.flagged) and total * world_size <= _LOCAL_REDUCE_BYTES:
        parts = [b.reshape(-1).view(torch.uint8) for b in buffers]
        if (len(parts) > 1 or plan.flagged) and total % 8:  # rows of whole 8-byte words: every slice keeps its dtype
            parts.append(torch.zeros(8 - total % 8, dtype=torch.uint8))
        if plan.flagged:  # one more word: 1 from a rank with real data, 0 from one without
            parts.append(torch.tensor([int(aliases is not None)], dtype=torch.int64).view(torch.uint8))
        message = parts[0] if len(parts) == 1 else torch.cat(parts)
        gathered = torch.empty(world_size * message.numel(), dtype=torch.uint8)
        _all_gather_flat(gathered, message, group)
        rows = gathered.view(world_size, -1)
        if plan.flagged:
            clean = bool((rows[:, -8:].view(torch.int64) == 1).all())
            if not clean and aliases is None:
                return False
        offset = 0
        for i, buffer in enumerate(buffers):
            size = buffer.numel() * buffer.element_size()
            values = rows[:, offset : offset + size].view(buffer.dtype)
            offset += size
            if i == 0 and not plan.flagged:
                clean = _rows_start_clean(values, plan.op)
                if not clean and aliases is None:
                    return False
            reduced = _reduce_rows(values, plan.op, world_size)
            if aliases is not None:
                _store(reduced, buffer, aliases[i])
        return clean
    if plan.flagged:
        return _reduce_flagged(plan, buffers, aliases, group, world_size)
    for i, buffer in enumerate(buffers):
        if plan.op == _MEAN:
            _all_reduce_mean(buffer, group, plan.backend, world_size)
        else:
            dist.all_reduce(buffer, op=plan.op, group=group)
        if i == 0:
            clean = _first_is_clean(buffer, plan.op)  # the probe: the first element (predicted buffers are on the CPU)
        if aliases is not None:
            _write_back(buffer, aliases[i])
    return clean


def _reduce_flagged(
    plan: _Plan, buffers: list[Tensor], aliases: list[list[Tensor]] | None, group: Any, world_size: int
) -> bool:
    """The backend's all-reduce of integer or boolean ``buffers`` where they are, and the flag (see :func:`_flag`)
    in a one-element all-reduce of its own; whether the flag says that every rank took part with real data.

    The data's all-reduces are queued first (``async_op``) and the flag's runs while they do: gloo works on a group's
    queue with more than one thread, so the flag costs its latency only where it outlasts the data (measured on 2 CPU
    ranks, each on a core of its own: 1.07-1.29x of the raw all-reduce of 1-16 MiB of int64 when the flag followed
    the data, 0.92-1.09x beside it; the control of ``benchmarks/bench_core.py``, a raw 4 MiB all-reduce with a
    one-element all-reduce beside it, measures 0.99x). Appending the flag to the payload would cost a copy into a
    longer buffer and a copy back, more than either (payloads gathered below ``_LOCAL_REDUCE_BYTES`` carry the flag in
    their message and never come here)."""
    sent, expected = _flag(plan.op, buffers[0].dtype, aliases is not None, world_size)
    ops = [_BOOL_OPS.get(plan.op, plan.op) if b.dtype == torch.bool else plan.op for b in buffers]
    ops = [ReduceOp.SUM if op == _MEAN else op for op in ops]
    works = [dist.all_reduce(b, op=op, group=group, async_op=True) for b, op in zip(buffers, ops, strict=True)]
    flag = torch.tensor([sent], dtype=torch.int64)
    dist.all_reduce(flag, op=ops[0], group=group)
    for i, (buffer, work) in enumerate(zip(buffers, works, strict=True)):
        work.wait()
        if plan.op == _MEAN and buffer.dtype != torch.bool:  # as _all_reduce_mean does
            if buffer.is_floating_point():
                buffer.div_(world_size)
            else:
                buffer.div_(world_size, rounding_mode="trunc")
        if aliases is not None:
            _write_back(buffer, aliases[i])  # nothing to copy for the caller's own contiguous tensor
    return int(flag.item()) == expected


def _store(reduced: Tensor, buffer: Tensor, members: list[Tensor]) -> None:
    """Write ``reduced`` (the reduction of ``buffer``, the flat buffer of ``members``) into ``members``."""
    if len(members) == 1 and members[0].is_contiguous() and buffer.data_ptr() == members[0].data_ptr():
        members[0].view(-1).copy_(reduced)
    else:
        _write_back(reduced, members)


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


def all_gather(
    tensors: Sequence[Tensor], group: Any, device: torch.device, sync_grads: bool, predict: bool | None = None
) -> list[Tensor]:
    """Gather each tensor from every rank of ``group`` into a new tensor of shape ``(world_size, *shape)``."""
    if not sync_grads and tensors:
        fused = _all_gather_fused(tensors, group, device, predict)
        if fused is not None:
            return fused
    else:
        check_collective("all_gather", tensors, group, device, predict)
    if sync_grads:
        return [_AllGatherGrad.apply(t, group) for t in tensors]  # type: ignore[no-untyped-call]
    if not tensors:
        return []
    groups = _group_by_device_dtype(tensors)
    outs = _gather_planned([_flat_buffer([t.detach() for t in members]) for members in groups], group, probe=False)[1]
    return _split_gathered(tensors, groups, outs, dist.get_world_size(group))


def _gather_planned(buffers: list[Tensor], group: Any, probe: bool = True) -> tuple[bool, list[Tensor]]:
    """All-gather each buffer (one per device and dtype) flat; whether the probe (the first element of the first
    buffer on every rank) is finite (always ``True`` without ``probe``), and the gathered buffers,
    ``(world_size, numel)`` each."""
    world_size = _world_size(group)
    outs = []
    for buffer in buffers:
        flat = buffer.reshape(-1)
        out = torch.empty(world_size * flat.numel(), dtype=flat.dtype, device=flat.device)
        _all_gather_flat(out, flat, group)
        outs.append(out.view(world_size, -1))
    clean = not probe or not outs or outs[0].shape[1] == 0 or not outs[0].is_floating_point()
    if not clean:
        first = outs[0]
        fast = first.dtype in _EXPONENT_BITS and first.device.type == "cpu"
        clean = _rows_start_finite(first) if fast else _finite(first[:, 0])
    return clean, outs


def _split_gathered(
    tensors: Sequence[Tensor], groups: Sequence[Sequence[Tensor]], outs: Sequence[Tensor], world_size: int
) -> list[Tensor]:
    results: dict[int, Tensor] = {}
    for members, rows in zip(groups, outs, strict=True):
        if len(members) == 1:
            results[id(members[0])] = rows.view(world_size, *members[0].shape)
            continue
        offset = 0
        for t in members:
            n = t.numel()
            results[id(t)] = rows[:, offset : offset + n].reshape(world_size, *t.shape)
            offset += n
    return [results[id(t)] for t in tensors]


def _all_gather_fused(
    tensors: Sequence[Tensor], group: Any, device: torch.device, predict: bool | None
) -> list[Tensor] | None:
    """Check the ranks' shapes and gather: at once when the call was predicted (see :class:`_History`), in the
    check's own collective for up to 480 bytes of tensors.

    Returns the gathered tensors, or ``None`` when they did not travel yet (the check has then passed)."""
    groups, plan = _planned("all_gather", "all_gather", None, dist.get_backend(group), tensors)
    early: list[Tensor] | None = None
    with _Agreement(group, plan, predict) as call_state:
        predicted = call_state.predicted
        if predicted is not None:
            if predicted.key == plan.key:
                clean, outs = _gather_planned([_flat_buffer([t.detach() for t in m]) for m in groups], group)
                early = _split_gathered(tensors, groups, outs, outs[0].shape[0])
                if clean:
                    call_state.hit = True
                    return early
            else:
                _run_poisoned(predicted, group)
        buffers: list[Tensor] | None = None
        if early is None and sum(t.numel() * t.element_size() for t in tensors) <= _PAYLOAD_BYTES:
            buffers = [_flat_buffer([t.detach() for t in members]).to(device) for members in groups]
        rows = _exchange("all_gather", tensors, groups, group, device, buffers)
    if early is not None:
        return early  # every rank gathered its real tensors (the signatures agree): a value was not finite
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
    therefore one collective; a larger payload follows in a second broadcast, where bandwidth dominates. A small
    tensor on the CPU like the last one broadcast from ``src`` (the same dtype, shape and flags: a loop's) travels in
    one message of its own size plus 16 bytes, as cheap as a raw ``dist.broadcast`` (see ``_BROADCASTS``).
    Tensors (and ``nn.Parameter``) travel as raw bytes, so any dtype works on any backend and nothing is pickled;
    receivers get them on ``device``. If ``src`` cannot pickle the object, every rank raises instead of waiting.
    """
    pg = _resolve(group)
    entry = _BROADCASTS.get((id(pg), src)) if device.type == "cpu" else None
    if entry is not None and entry.group is not pg:
        entry = None
    predicted = entry.header if entry is not None else None
    if dist.get_rank() == src:
        if entry is not None and entry.holds(obj):
            return entry.send(obj, src, group)
        return _broadcast_send(obj, src, group, device, predicted)
    if predicted is not None:
        received = _receive_predicted(predicted, src, group)
        if received is not None:
            return received
    on_host = device.type == "cpu"
    # on the CPU the message is a bytearray seen as a tensor: the header is read, and a small tensor received, from
    # it without a copy (the received tensor owns the bytearray)
    raw = bytearray(_HEADER_BYTES + _INLINE_BYTES) if on_host else None
    message = (
        torch.frombuffer(raw, dtype=torch.uint8)
        if raw is not None
        else torch.empty(_HEADER_BYTES + _INLINE_BYTES, dtype=torch.uint8, device=device)
    )
    dist.broadcast(message, src=src, group=group)
    header_bytes = raw if raw is not None else message.narrow(0, 0, _HEADER_BYTES).cpu().numpy().tobytes()
    header = struct.unpack_from(_HEADER_FORMAT, header_bytes, 0)
    kind, nbytes = header[0], header[_NBYTES_AT]
    _remember_broadcast(group, src, header, device)
    if kind == _KIND_TENSOR and raw is not None and 0 < nbytes <= _INLINE_BYTES:
        dtype = _DTYPES[header[1]]
        received = torch.frombuffer(raw, dtype=dtype, count=nbytes // dtype.itemsize, offset=_HEADER_BYTES)
        return _as_received(received.reshape(header[_SHAPE_AT : _SHAPE_AT + header[2]]), header[3])
    if nbytes <= _INLINE_BYTES:
        data = message.narrow(0, _HEADER_BYTES, nbytes)
    else:  # too large for the header message: a second broadcast, sized from the header
        data = torch.empty(nbytes, dtype=torch.uint8, device=device)
        dist.broadcast(data, src=src, group=group)
    if kind == _KIND_OBJECT:
        return pickle.loads(data.cpu().numpy().tobytes())
    if kind == _KIND_ERROR:
        _raise_unpicklable(src, data.cpu().numpy().tobytes().decode(errors="replace"), None)
    received = data.view(_DTYPES[header[1]]).reshape(header[_SHAPE_AT : _SHAPE_AT + header[2]])
    return _as_received(received if nbytes > _INLINE_BYTES else received.clone(), header[3])


def _as_received(received: Tensor, flags: int) -> Tensor:
    """A received tensor as it was sent: an ``nn.Parameter`` or not, requiring grad or not (header flags)."""
    if flags & 2:
        return torch.nn.Parameter(received, requires_grad=bool(flags & 1))
    return received.requires_grad_(bool(flags & 1))


# A loop broadcasts the same kind of tensor again and again. Every rank remembers the header of the last broadcast
# from each source (it learns every header), and predicts the next one: then the source sends one message of
# exactly the predicted payload's size behind a 16-byte prefix whose first byte says whether the prediction held,
# with the payload when it did (what a raw broadcast sends, plus 16 bytes). When it did not, every rank reads so and
# takes the path above (the header message), and remembers the new header. Only small tensors on the CPU.
class _PredictedBroadcast:
    """The last broadcast from one source in one group, which every rank predicts the next to be like: its header,
    and on the source a reusable message whose prefix already says that the prediction held."""

    __slots__ = ("dtype", "flags", "group", "header", "message", "payload", "shape")

    def __init__(self, group: Any, header: tuple[int, ...]) -> None:
        self.group = group
        self.header = header
        self.dtype = _DTYPES[header[1]]
        self.shape = torch.Size(header[_SHAPE_AT : _SHAPE_AT + header[2]])
        self.flags = header[3]
        self.message: Tensor | None = None  # the source's, made at its first predicted send
        self.payload: Tensor | None = None

    def holds(self, obj: Any) -> bool:
        """Whether ``obj`` is a tensor with the predicted header (dtype, shape, ``requires_grad``, parameter or not)."""
        kind = type(obj)
        return (
            (kind is Tensor or kind is torch.nn.Parameter)
            and obj.dtype is self.dtype
            and obj.shape == self.shape
            and int(obj.requires_grad) | (int(kind is torch.nn.Parameter) << 1) == self.flags
        )

    def send(self, obj: Tensor, src: int, group: Any) -> Tensor:
        """Broadcast ``obj``, which :meth:`holds`: its bytes behind the prefix, in one message. The message is reused
        (the call returns when it was sent; receivers keep buffers of their own), so this costs one copy."""
        if self.message is None:
            self.message = torch.zeros(_PREDICTED_PREFIX + self.header[_NBYTES_AT], dtype=torch.uint8)
            self.message[0] = 1
            self.payload = self.message.narrow(0, _PREDICTED_PREFIX, self.header[_NBYTES_AT])
            self.payload = self.payload.view(self.dtype).view(self.shape)
        assert self.payload is not None
        self.payload.copy_(obj.detach())  # any strides: one copy into the message
        dist.broadcast(self.message, src=src, group=group)
        _BROADCAST_HITS[0] += 1
        return obj


_BROADCASTS: dict[tuple[int, int], _PredictedBroadcast] = {}
_PREDICTED_PREFIX = 16  # bytes before the payload: aligned for every dtype
_BROADCAST_HITS = [0]  # broadcasts that took the predicted path (for tests and benchmarks)


def predicted_broadcasts() -> int:
    """How many broadcasts so far (from or to this rank) were predicted and needed one message of their own size."""
    return _BROADCAST_HITS[0]


def _remember_broadcast(group: Any, src: int, header: Sequence[int], device: torch.device) -> None:
    pg = _resolve(group)
    if device.type == "cpu" and header[0] == _KIND_TENSOR and 0 < header[_NBYTES_AT] <= _INLINE_BYTES:
        _BROADCASTS[(id(pg), src)] = _PredictedBroadcast(pg, tuple(header))
    else:
        _BROADCASTS.pop((id(pg), src), None)


def _receive_predicted(predicted: tuple[int, ...], src: int, group: Any) -> Tensor | None:
    """Receive a broadcast predicted to carry a tensor with header ``predicted``; ``None`` when ``src`` says it
    does not (the header message follows)."""
    nbytes = predicted[_NBYTES_AT]
    raw = bytearray(_PREDICTED_PREFIX + nbytes)
    dist.broadcast(torch.frombuffer(raw, dtype=torch.uint8), src=src, group=group)
    if raw[0] != 1:
        return None
    _BROADCAST_HITS[0] += 1
    dtype = _DTYPES[predicted[1]]
    received = torch.frombuffer(raw, dtype=dtype, count=nbytes // dtype.itemsize, offset=_PREDICTED_PREFIX)
    return _as_received(received.reshape(predicted[_SHAPE_AT : _SHAPE_AT + predicted[2]]), predicted[3])


def _broadcast_send(obj: Any, src: int, group: Any, device: torch.device, predicted: tuple[int, ...] | None) -> Any:
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
    if predicted is not None:
        # the prediction did not hold (``_PredictedBroadcast.send`` takes those that do): a message of the predicted
        # size whose prefix says so, then the header message below
        dist.broadcast(torch.zeros(_PREDICTED_PREFIX + predicted[_NBYTES_AT], dtype=torch.uint8), src=src, group=group)
    _remember_broadcast(group, src, header, device)
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
