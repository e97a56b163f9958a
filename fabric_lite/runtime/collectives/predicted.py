"""Predicted calls: an optional layer over the checked core that makes a loop's checked collectives cost what the
backend's own do.

Every rank keeps the same history of agreed calls, so every rank predicts the same next call and runs it at once: with
its own tensors if it called the predicted one, else with a marked buffer of the predicted sizes
(:mod:`~fabric_lite.runtime.collectives.marks`), so the sizes agree whatever each rank called. A clean probe means every
rank sent real data; otherwise every rank takes the checked core's exchange, which raises the mismatch on every rank
(the tensors are then undefined) or, when the signatures agree, lets the result stand. Only CPU tensors over gloo are
predicted: reading a probe would synchronise a device. With ``CheckedGroup.predicting`` off (debug mode) every call is
the checked core's.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from fabric_lite.runtime.collectives.broadcasts import BroadcastGroup
from fabric_lite.runtime.collectives.checked import _exchange, _grouped, _signature, all_reduce_checked
from fabric_lite.runtime.collectives.gather import _gather_after_check, _split_gathered, all_gather_checked
from fabric_lite.runtime.collectives.marks import (
    _EXPONENT_BITS,
    _FLAGGED,
    _FLOATS,
    _POISON,
    _clean_at,
    _finite,
    _flag,
    _mark,
    _rows_start_clean,
)
from fabric_lite.runtime.collectives.ops import (
    _BOOL_OPS,
    _MEAN,
    ReduceOp,
    _alias,
    _all_gather_flat,
    _all_reduce_mean,
    _by_element_size,
    _columns,
    _divide_,
    _flat_buffer,
    _gather_buffers,
    _group_by_device_dtype,
    _reduce_rows,
    _write_back,
)

# up to this many gathered bytes, an all-gather and a local reduction beat gloo's all-reduce; not for a single float
# element, whose all-reduce skips gloo's ring
_LOCAL_REDUCE_BYTES = 1 << 20
# the most plans a group keeps (a loop repeats a handful)
_MAX_PLANS = 1024
#: the history's "previous call" before the first one
_START = (0, 0, 0)
_MAX_HISTORY = 256


class _Plan:
    """A checked collective as every rank sees it: its signature, kind, reduce op and flat buffers."""

    __slots__ = ("backend", "flagged", "key", "kind", "layout", "nbytes", "numel", "op", "predictable")

    def __init__(
        self, key: tuple[int, int, int], kind: str, op: Any, groups: Sequence[Sequence[Tensor]], backend: str
    ) -> None:
        self.key = key
        self.kind = kind
        self.op = op
        self.backend = backend
        # (dtype, numel) of each flat buffer; none for device tensors: the probe would synchronise the device
        cpu = all(m[0].device.type == "cpu" for m in groups)
        self.layout = layout = tuple((m[0].dtype, sum(t.numel() for t in m)) for m in groups if cpu)
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


class CheckedGroup(BroadcastGroup):
    """A process group and the state of its checked collectives, made by the strategy for each group and dropped with
    it, so that no state outlives the group or is shared between strategies: the checked core's and the broadcasts'
    state, the history of agreed calls, the plans of the calls seen, and whether calls are ``predicting`` (off in debug
    mode). ``check_group``: as for :class:`~fabric_lite.runtime.collectives.checked.GroupState`.

    Example::

        checked = CheckedGroup(None, predicting=not debug)  # the default group
        op = resolve_reduce_op("mean")
        all_reduce([loss], op, checked, torch.device("cpu"), reduce_call(op))  # loss: the ranks' mean, in place
    """

    __slots__ = ("history", "plans", "predicting")

    def __init__(self, group: Any, *, predicting: bool = True, check_group: Any = None) -> None:
        super().__init__(group, check_group=check_group)
        self.predicting = predicting
        self.history = _History()
        # signature -> the plan of the call
        self.plans: dict[tuple[int, int, int], _Plan] = {}


def _plan(
    group: CheckedGroup, signature: tuple[int, int, int], kind: str, op: Any, groups: Sequence[Sequence[Tensor]]
) -> _Plan:
    """The plan of the call with ``signature`` (``groups``: its tensors, grouped), made once per group."""
    plan = group.plans.get(signature)
    if plan is None:
        if len(group.plans) >= _MAX_PLANS:
            group.plans.clear()
        plan = group.plans[signature] = _Plan(signature, kind, op, groups, group.backend)
    return plan


class _Agreement:
    """Around one checked call: ``predicted`` is the plan every rank predicts (``None`` without one); on leaving,
    ``plan`` is recorded as agreed, or the history is forgotten when the call raised. A class, not a generator-based
    context manager, because every checked collective enters one."""

    __slots__ = ("history", "hit", "plan", "predicted")

    def __init__(self, history: _History, plan: _Plan) -> None:
        self.history = history
        self.plan = plan
        self.predicted = history.predicted()
        self.hit = False  # the predicted collective was the whole call

    def __enter__(self) -> _Agreement:
        return self

    def __exit__(self, kind: type[BaseException] | None, *_: object) -> None:
        if kind is not None:
            self.history.forget()
        else:
            self.history.advance(self.plan, hit=self.hit)


# ---------------------------------------------------------------------------------------------- the entry points
def all_reduce(
    tensors: Sequence[Tensor],
    reduce_op: Any,
    group: CheckedGroup,
    device: torch.device,
    call: str,
    key: tuple[Any, ...] | None = None,
) -> None:
    """:func:`all_reduce_checked` (``tensors`` reduced in place; ``call`` and ``key`` as there), run at once in the
    backend's own collective when every rank's history predicts the call and ``group.predicting`` is on."""
    if not group.predicting:
        all_reduce_checked(tensors, reduce_op, group, device, call, key=key)
        return
    grouped = groups, signature = _grouped(group, call, tensors, key)
    plan = _plan(group, signature, "all_reduce", reduce_op, groups)
    with _Agreement(group.history, plan) as agreement:
        predicted = agreement.predicted
        if predicted is not None and predicted.key == plan.key:
            aliases = [[_alias(t) for t in members] for members in groups]
            agreement.hit = _reduce_planned(plan, [_flat_buffer(a) for a in aliases], aliases, group)
            if not agreement.hit:
                # reduced already: the probe says that a value is not finite, or a mismatch. The exchange raises the
                # mismatch; when the signatures agree, every rank matched the prediction and the reduction stands
                _exchange(call, tensors, signature, group.group, device, None, group.check_group)
            return
        if predicted is not None:
            _run_poisoned(predicted, group)
        all_reduce_checked(tensors, reduce_op, group, device, call, grouped)


def all_gather(tensors: Sequence[Tensor], group: CheckedGroup, device: torch.device, sync_grads: bool) -> list[Tensor]:
    """:func:`all_gather_checked` (one ``(world_size, *shape)`` tensor per input, after checking the shapes and dtypes),
    run at once when every rank's history predicts the call and ``group.predicting`` is on."""
    if not group.predicting:
        return all_gather_checked(tensors, group, device, sync_grads)
    if sync_grads or not tensors:
        _check("all_gather", tensors, group, device)
        return _gather_after_check(tensors, group, sync_grads)
    grouped = groups, signature = _grouped(group, "all_gather", tensors)
    plan = _plan(group, signature, "all_gather", None, groups)
    with _Agreement(group.history, plan) as agreement:
        predicted = agreement.predicted
        if predicted is not None and predicted.key == plan.key:
            clean, outs = _gather_planned([_flat_buffer([t.detach() for t in m]) for m in groups], group)
            agreement.hit = clean
            if not clean:  # the exchange raises a mismatch; when the signatures agree, a value was not finite
                _exchange("all_gather", tensors, signature, group.group, device, None, group.check_group)
            return _split_gathered(tensors, groups, outs, outs[0].shape[0])
        if predicted is not None:
            _run_poisoned(predicted, group)
        return all_gather_checked(tensors, group, device, False, grouped)


def _check(call: str, tensors: Sequence[Tensor], group: CheckedGroup, device: torch.device) -> None:
    """``check_collective`` as one of the calls in ``group``'s history: where another call is predicted, this rank
    takes part in it without real data first, so that every rank sees the mismatch."""
    signature = _signature(call, _by_element_size(_group_by_device_dtype(tensors)) if tensors else [])
    with _Agreement(group.history, _Plan(signature, "check", None, [], "")) as agreement:
        if agreement.predicted is not None:
            _run_poisoned(agreement.predicted, group)
        _exchange(call, tensors, signature, group.group, device, None, group.check_group)


# ---------------------------------------------------------------------------------------------- running a plan
def _poisoned(plan: _Plan) -> list[Tensor]:
    if plan.flagged:  # the flag marks these, whatever they hold
        return [torch.zeros(numel, dtype=dtype) for dtype, numel in plan.layout]
    if plan.kind == "all_gather":
        return [torch.full((numel,), math.nan, dtype=dtype) for dtype, numel in plan.layout]
    return [torch.full((numel,), _mark(plan.op, dtype), dtype=dtype) for dtype, numel in plan.layout]  # type: ignore[arg-type]


def _run_poisoned(plan: _Plan, group: CheckedGroup) -> None:
    """Take part in the predicted collective without real data (this rank calls something else)."""
    if plan.kind == "all_gather":
        _gather_planned(_poisoned(plan), group)
    else:
        _reduce_planned(plan, _poisoned(plan), None, group)


def _gather_planned(buffers: list[Tensor], group: CheckedGroup) -> tuple[bool, list[Tensor]]:
    """All-gather each buffer (one per device and dtype) flat; whether the probe (the first element of the first
    buffer on every rank) is finite, and the gathered buffers, ``(world_size, numel)`` each."""
    outs = _gather_buffers(buffers, group.group, group.world_size)
    clean = not outs or outs[0].shape[1] == 0 or not outs[0].is_floating_point()
    if not clean:
        first = outs[0]
        fast = first.dtype in _EXPONENT_BITS and first.device.type == "cpu"
        clean = _rows_start_clean(first, None) if fast else _finite(first[:, 0])
    return clean, outs


def _reduce_planned(
    plan: _Plan, buffers: list[Tensor], aliases: list[list[Tensor]] | None, group: CheckedGroup
) -> bool:
    """Run ``plan``'s reduction on ``buffers`` (written back into ``aliases`` when given); whether the probe is clean.
    Small payloads are all-gathered and reduced locally (``_LOCAL_REDUCE_BYTES``); the choice depends on the plan alone,
    so every rank makes the same one."""
    world_size = group.world_size
    total = plan.nbytes
    clean = True
    if (plan.numel > 1 or plan.flagged) and total * world_size <= _LOCAL_REDUCE_BYTES:
        parts = [b.reshape(-1).view(torch.uint8) for b in buffers]
        if (len(parts) > 1 or plan.flagged) and total % 8:  # rows of whole 8-byte words: every slice keeps its dtype
            parts.append(torch.zeros(8 - total % 8, dtype=torch.uint8))
        if plan.flagged:  # one more word: 1 from a rank with real data, 0 from one without
            parts.append(torch.tensor([int(aliases is not None)], dtype=torch.int64).view(torch.uint8))
        rows = _all_gather_flat(parts[0] if len(parts) == 1 else torch.cat(parts), group.group, world_size)
        if plan.flagged:
            clean = bool((rows[:, -8:].view(torch.int64) == 1).all())
            if not clean and aliases is None:
                return False
        for i, values in enumerate(_columns(rows, buffers)):
            if i == 0 and not plan.flagged:
                clean = _rows_start_clean(values, plan.op)
                if not clean and aliases is None:
                    return False
            reduced = _reduce_rows(values, plan.op, world_size)
            if aliases is not None:
                _write_back(reduced, aliases[i])
        return clean
    if plan.flagged:
        return _reduce_flagged(plan, buffers, aliases, group)
    for i, buffer in enumerate(buffers):
        if plan.op == _MEAN:
            _all_reduce_mean(buffer, group.group, plan.backend, world_size)
        else:
            dist.all_reduce(buffer, op=plan.op, group=group.group)
        if i == 0:
            clean = _clean_at([buffer.data_ptr()], buffer.dtype, plan.op)  # the probe: the first element, on the CPU
        if aliases is not None:
            _write_back(buffer, aliases[i])
    return clean


def _reduce_flagged(
    plan: _Plan, buffers: list[Tensor], aliases: list[list[Tensor]] | None, group: CheckedGroup
) -> bool:
    """The backend's all-reduce of integer or boolean ``buffers``, and the flag (``marks._flag``) in a one-element
    all-reduce of its own; whether every rank took part with real data. The data's all-reduces are queued first
    (``async_op``) so that the flag's runs beside them: appending the flag to the payload would cost two copies."""
    world_size = group.world_size
    sent, expected = _flag(plan.op, buffers[0].dtype, aliases is not None, world_size)
    ops = [_BOOL_OPS.get(plan.op, plan.op) if b.dtype == torch.bool else plan.op for b in buffers]
    ops = [ReduceOp.SUM if op == _MEAN else op for op in ops]
    works = [dist.all_reduce(b, op=op, group=group.group, async_op=True) for b, op in zip(buffers, ops, strict=True)]
    flag = torch.tensor([sent], dtype=torch.int64)
    dist.all_reduce(flag, op=ops[0], group=group.group)
    for i, (buffer, work) in enumerate(zip(buffers, works, strict=True)):
        work.wait()
        if plan.op == _MEAN and buffer.dtype != torch.bool:  # as _all_reduce_mean does
            _divide_(buffer, world_size)
        if aliases is not None:
            _write_back(buffer, aliases[i])  # nothing to copy for the caller's own contiguous tensor
    return int(flag.item()) == expected
