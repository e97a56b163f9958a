"""The checked core: every rank's signature exchanged before a collective, and the error on every rank when they differ.

Raw gloo aborts the process on tensors of different sizes and silently returns wrong data for equal sizes but different
shapes. So every checked collective starts with one all-gather of a fixed-size message per rank (the call's signature
and, when they fit, the tensors' bytes): it can never mismatch itself, and it completes small reductions and gathers on
its own. :mod:`~fabric_lite.runtime.collectives.predicted` is an optional speed layer over it.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from fabric_lite.runtime.collectives.ops import (
    _DTYPE_CODE,
    _FUSED_OPS,
    _alias,
    _all_gather_flat,
    _by_element_size,
    _columns,
    _flat_buffer,
    _group_by_device_dtype,
    _reduce_rows,
    _same_shape,
    _write_back,
    all_reduce_,
)

_SIGNATURE_BYTES = 32
_SIGNATURE_FORMAT = "<4q"  # count, two 64-bit halves of the digest, payload bytes (or -1)
_MESSAGE_BYTES = 512
_PAYLOAD_BYTES = _MESSAGE_BYTES - _SIGNATURE_BYTES
# the dtypes' bytes are packed largest element first, so that every slice of the message is aligned for its dtype
_NO_PAYLOAD = -1
# the most calls a group remembers the grouping and signature of (a loop repeats a handful)
_MAX_CALLS = 1024


class CollectiveMismatchError(ValueError):
    """The ranks called different collectives, or the same one with tensors that differ in shape or dtype. Raised on
    every rank, before any data is exchanged, with one line per rank saying what it called."""


class GroupState:
    """A process group and what its checked core keeps: the group's backend and world size, the ``check_group`` (a gloo
    group of the same ranks that carries the checks on the host for NCCL, where a check on the device would make the
    host wait for the GPU twice a call), and the grouping and signature of the calls seen. Each layer above adds its
    state in a subclass, as torch's ``ProcessGroupWrapper`` keeps its check beside the group, so nothing outlives the
    group or is shared between two ``Fabric`` objects."""

    __slots__ = ("backend", "calls", "check_group", "group", "seq", "trail_index", "world_size")

    def __init__(self, group: Any, *, check_group: Any = None) -> None:
        self.group = group if group is not None else dist.group.WORLD
        # fixed while the group lives, and needed on every call: looked up once
        self.backend: str = dist.get_backend(self.group)
        self.world_size = dist.get_world_size(self.group)
        self.check_group = check_group
        # (call, the tensors' dtypes, devices and shapes) -> (their grouping, as indices, and the call's signature)
        self.calls: dict[tuple[Any, ...], tuple[list[list[int]], tuple[int, int, int]]] = {}
        # this group's place in the rank's trail of collectives (fabric_lite.runtime.diagnostics.trail), and how many
        # of its user-facing collectives this rank has entered: ranks in lockstep agree on the count
        self.trail_index = 0
        self.seq = 0


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


def call_key(call: str, tensors: Sequence[Tensor]) -> tuple[Any, ...]:
    """What identifies a call: its name and its tensors' dtypes, devices and shapes (see :func:`_grouped`)."""
    return (call, *[(t.dtype, t.device, t.shape) for t in tensors])


def _grouped(
    group: GroupState, call: str, tensors: Sequence[Tensor], key: tuple[Any, ...] | None = None
) -> tuple[list[list[Tensor]], tuple[int, int, int]]:
    """The tensors grouped by device and dtype (largest elements first), and the call's signature, cached per group:
    both depend only on the call and the tensors' dtypes, devices and shapes. ``key``: :func:`call_key`'s answer, where
    the caller has it."""
    if key is None:
        key = call_key(call, tensors)
    entry = group.calls.get(key)
    if entry is None:
        groups = _by_element_size(_group_by_device_dtype(tensors))
        position = {id(t): i for i, t in enumerate(tensors)}
        indices = [[position[id(t)] for t in members] for members in groups]
        if len(group.calls) >= _MAX_CALLS:
            group.calls.clear()
        group.calls[key] = (indices, _signature(call, groups))
        return groups, group.calls[key][1]
    indices, signature = entry
    if len(indices) == 1 and len(indices[0]) == len(tensors):
        return [list(tensors)], signature
    return [[tensors[i] for i in members] for members in indices], signature


def _exchange(
    call: str,
    tensors: Sequence[Tensor],
    signature: tuple[int, int, int],
    group: Any,
    device: torch.device,
    payload: Sequence[Tensor] | None,
    check_group: Any = None,
) -> Tensor | None:
    """All-gather every rank's ``signature`` of ``call`` on ``tensors`` over ``group`` (or over ``check_group`` on the
    host, without payload), with ``payload`` (flat buffers, in alignment order, that fit: :func:`_payload`'s); raise
    :class:`CollectiveMismatchError` on every rank when the signatures differ. Returns the payload's rows, one per rank,
    or ``None`` when it did not travel."""
    if check_group is not None:  # device tensors: the signatures travel on the host, the data stay where they are
        group, device, payload = check_group, torch.device("cpu"), None
    world_size = dist.get_world_size(group)
    nbytes = _NO_PAYLOAD if payload is None else sum(b.numel() * b.element_size() for b in payload)
    # built on the host with struct and buffer copies, cheaper than a handful of small torch ops
    raw = bytearray(_MESSAGE_BYTES)
    struct.pack_into(_SIGNATURE_FORMAT, raw, 0, *signature, nbytes)
    if payload is not None:
        offset = _SIGNATURE_BYTES
        for buffer in payload:
            data = buffer.reshape(-1).view(torch.uint8)
            size = data.numel()
            raw[offset : offset + size] = (data if data.device.type == "cpu" else data.cpu()).numpy().tobytes()
            offset += size
    message = torch.frombuffer(raw, dtype=torch.uint8)
    if device.type != "cpu":
        message = message.to(device)
    rows = _all_gather_flat(message, group, world_size)
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
    call: str, tensors: Sequence[Tensor], group: Any, device: torch.device, check_group: Any = None
) -> None:
    """Raise :class:`CollectiveMismatchError` on every rank, with a per-rank table, unless every rank of ``group`` calls
    the same ``call`` (e.g. ``"barrier"``) on tensors of the same count, shapes and dtypes. Costs one small collective,
    on ``check_group`` when given."""
    groups = _by_element_size(_group_by_device_dtype(tensors)) if tensors else []
    _exchange(call, tensors, _signature(call, groups), group, device, None, check_group)


def _payload(
    tensors: Sequence[Tensor], groups: Sequence[Sequence[Tensor]], device: torch.device
) -> tuple[list[list[Tensor]], list[Tensor]] | None:
    """The tensors' aliases and flat buffers (on ``device``) when they fit in the exchange, else ``None``."""
    if sum(t.numel() * t.element_size() for t in tensors) > _PAYLOAD_BYTES:
        return None
    aliases = [[_alias(t) for t in members] for members in groups]
    return aliases, [_flat_buffer(a).to(device) for a in aliases]


def all_reduce_checked(
    tensors: Sequence[Tensor],
    reduce_op: Any,
    group: GroupState,
    device: torch.device,
    call: str,
    grouped: tuple[list[list[Tensor]], tuple[int, int, int]] | None = None,
    key: tuple[Any, ...] | None = None,
) -> None:
    """:func:`all_reduce_`, after checking that every rank reduces the same shapes and dtypes with the same op. Up to
    480 bytes of tensors travel with the check and are reduced locally, identically on every rank. ``call`` names the
    call (``reduce_call``); ``grouped`` and ``key`` are :func:`_grouped`'s and :func:`call_key`'s answers, where the
    caller has them."""
    groups, signature = grouped or _grouped(group, call, tensors, key)
    # reduced locally: an op and dtypes that _reduce_rows handles
    fusable = reduce_op in _FUSED_OPS and all(m[0].dtype in _DTYPE_CODE and not m[0].is_complex() for m in groups)
    payload = _payload(tensors, groups, device) if fusable else None
    buffers = payload[1] if payload is not None else None
    rows = _exchange(call, tensors, signature, group.group, device, buffers, group.check_group)
    if rows is None or payload is None:  # the tensors did not travel with the exchange: the backend reduces them
        all_reduce_(tensors, reduce_op, group.group, group.backend)
        return
    aliases, buffers = payload
    for members, values in zip(aliases, _columns(rows, buffers), strict=True):
        _write_back(_reduce_rows(values, reduce_op, rows.shape[0]).to(members[0].device), members)
