"""Broadcasts: one message carrying a header and, when it fits, the payload; and broadcasts predicted from the last one
from the same source.

Tensors travel as raw bytes (any dtype on any backend, nothing pickled); other objects are pickled. Every rank remembers
the header of the last broadcast from each source, so a loop's small CPU tensor travels in one message of its own size
behind a 16-byte prefix that says whether the prediction held; when it did not, the header message follows.
"""

from __future__ import annotations

import pickle
import struct
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from fabric_lite.runtime.collectives.checked import GroupState
from fabric_lite.runtime.collectives.ops import _DTYPE_CODE, _DTYPES, _MAX_HEADER_DIMS

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
_PREDICTED_PREFIX = 16  # bytes before a predicted broadcast's payload: aligned for every dtype


def broadcast(obj: Any, src: int, group: BroadcastGroup, device: torch.device) -> Any:
    """Send ``obj`` from global rank ``src`` to every rank of ``group``; every rank returns it (tensors on ``device``).
    A small tensor or object is one collective, a larger payload follows in a second; a small CPU tensor like the last
    one from ``src`` costs a raw ``dist.broadcast`` (:class:`_PredictedBroadcast`). If ``src`` cannot pickle ``obj``,
    every rank raises ``TypeError`` instead of waiting."""
    entry = group.broadcasts.get(src) if device.type == "cpu" else None
    predicted = entry.header if entry is not None else None
    if dist.get_rank() == src:
        if entry is not None and entry.holds(obj):
            return entry.send(obj, src, group)
        return _broadcast_send(obj, src, group, device, predicted)
    if predicted is not None:
        received = _receive_predicted(predicted, src, group)
        if received is not None:
            return received
    # on the CPU the message is a bytearray seen as a tensor: the header is read, and a small tensor received, from
    # it without a copy (the received tensor owns the bytearray)
    raw = bytearray(_HEADER_BYTES + _INLINE_BYTES) if device.type == "cpu" else None
    message = (
        torch.frombuffer(raw, dtype=torch.uint8)
        if raw is not None
        else torch.empty(_HEADER_BYTES + _INLINE_BYTES, dtype=torch.uint8, device=device)
    )
    dist.broadcast(message, src=src, group=group.group)
    header_bytes = raw if raw is not None else message.narrow(0, 0, _HEADER_BYTES).cpu().numpy().tobytes()
    header = struct.unpack_from(_HEADER_FORMAT, header_bytes, 0)
    kind, nbytes = header[0], header[_NBYTES_AT]
    _remember_broadcast(group, src, header, device)
    if kind == _KIND_TENSOR and raw is not None and 0 < nbytes <= _INLINE_BYTES:
        return _tensor_in(raw, _HEADER_BYTES, header)
    if nbytes <= _INLINE_BYTES:
        data = message.narrow(0, _HEADER_BYTES, nbytes)
    else:  # too large for the header message: a second broadcast, sized from the header
        data = torch.empty(nbytes, dtype=torch.uint8, device=device)
        dist.broadcast(data, src=src, group=group.group)
    if kind == _KIND_OBJECT:
        return pickle.loads(data.cpu().numpy().tobytes())
    if kind == _KIND_ERROR:
        _raise_unpicklable(src, data.cpu().numpy().tobytes().decode(errors="replace"), None)
    received = data.view(_DTYPES[header[1]])
    return _as_received(received if nbytes > _INLINE_BYTES else received.clone(), header)


def _tensor_in(raw: bytearray, offset: int, header: Sequence[int]) -> Tensor:
    """The tensor that ``header`` describes, from its bytes at ``offset`` in ``raw`` (which it owns: no copy)."""
    dtype = _DTYPES[header[1]]
    received = torch.frombuffer(raw, dtype=dtype, count=header[_NBYTES_AT] // dtype.itemsize, offset=offset)
    return _as_received(received, header)


def _as_received(received: Tensor, header: Sequence[int]) -> Tensor:
    """A received flat tensor as it was sent (``header``): its shape, ``nn.Parameter`` or not, and ``requires_grad``."""
    received = received.reshape(header[_SHAPE_AT : _SHAPE_AT + header[2]])
    flags = header[3]
    if flags & 2:
        return torch.nn.Parameter(received, requires_grad=bool(flags & 1))
    return received.requires_grad_(bool(flags & 1))


class _PredictedBroadcast:
    """The last broadcast from one source in one group, which every rank predicts the next to be like: its header,
    and on the source a reusable message whose prefix already says that the prediction held."""

    __slots__ = ("dtype", "flags", "header", "message", "payload", "shape")

    def __init__(self, header: tuple[int, ...]) -> None:
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

    def send(self, obj: Tensor, src: int, group: BroadcastGroup) -> Tensor:
        """Broadcast ``obj``, which :meth:`holds`: its bytes behind the prefix, in one message. The message is reused
        (the call returns when it was sent; receivers keep buffers of their own), so this costs one copy."""
        if self.message is None:
            self.message = torch.zeros(_PREDICTED_PREFIX + self.header[_NBYTES_AT], dtype=torch.uint8)
            self.message[0] = 1
            self.payload = self.message.narrow(0, _PREDICTED_PREFIX, self.header[_NBYTES_AT])
            self.payload = self.payload.view(self.dtype).view(self.shape)
        assert self.payload is not None
        self.payload.copy_(obj.detach())  # any strides: one copy into the message
        dist.broadcast(self.message, src=src, group=group.group)
        group.broadcast_hits += 1
        return obj


class BroadcastGroup(GroupState):
    """:class:`GroupState` and the broadcasts predicted in the group: the last one from each source rank, which the
    next one from it is predicted to be like, and how many took the predicted path (for tests and benchmarks)."""

    __slots__ = ("broadcast_hits", "broadcasts")

    def __init__(self, group: Any, *, check_group: Any = None) -> None:
        super().__init__(group, check_group=check_group)
        self.broadcasts: dict[int, _PredictedBroadcast] = {}
        self.broadcast_hits = 0


def _remember_broadcast(group: BroadcastGroup, src: int, header: Sequence[int], device: torch.device) -> None:
    if device.type == "cpu" and header[0] == _KIND_TENSOR and 0 < header[_NBYTES_AT] <= _INLINE_BYTES:
        group.broadcasts[src] = _PredictedBroadcast(tuple(header))
    else:
        group.broadcasts.pop(src, None)


def _receive_predicted(predicted: tuple[int, ...], src: int, group: BroadcastGroup) -> Tensor | None:
    """Receive a broadcast predicted to carry a tensor with header ``predicted``; ``None`` when ``src`` says it
    does not (the header message follows)."""
    raw = bytearray(_PREDICTED_PREFIX + predicted[_NBYTES_AT])
    dist.broadcast(torch.frombuffer(raw, dtype=torch.uint8), src=src, group=group.group)
    if raw[0] != 1:
        return None
    group.broadcast_hits += 1
    return _tensor_in(raw, _PREDICTED_PREFIX, predicted)


def _broadcast_send(
    obj: Any, src: int, group: BroadcastGroup, device: torch.device, predicted: tuple[int, ...] | None
) -> Any:
    header = [0] * _HEADER_WORDS
    error: BaseException | None = None
    if type(obj) in (Tensor, torch.nn.Parameter) and obj.dtype in _DTYPE_CODE and obj.dim() <= _MAX_HEADER_DIMS:
        payload = obj.detach().contiguous().reshape(-1).view(torch.uint8)  # a copy only if it is not contiguous
        flags = int(obj.requires_grad) | (int(isinstance(obj, torch.nn.Parameter)) << 1)
        header[:4] = [_KIND_TENSOR, _DTYPE_CODE[obj.dtype], obj.dim(), flags]
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
        zeros = torch.zeros(_PREDICTED_PREFIX + predicted[_NBYTES_AT], dtype=torch.uint8)
        dist.broadcast(zeros, src=src, group=group.group)
    _remember_broadcast(group, src, header, device)
    # the message is built on the host: the header packed with struct (far cheaper than writing a tensor
    # element by element), the payload copied in with one copy_
    raw = bytearray(_HEADER_BYTES + _INLINE_BYTES)
    struct.pack_into(_HEADER_FORMAT, raw, 0, *header)
    message = torch.frombuffer(raw, dtype=torch.uint8)
    if nbytes <= _INLINE_BYTES:
        message.narrow(0, _HEADER_BYTES, nbytes).copy_(payload)
    dist.broadcast(message.to(device), src=src, group=group.group)
    if nbytes > _INLINE_BYTES:
        dist.broadcast(payload.to(device), src=src, group=group.group)
    if error is not None:
        _raise_unpicklable(src, bytes(raw[_HEADER_BYTES : _HEADER_BYTES + nbytes]).decode(errors="replace"), error)
    return obj


def _raise_unpicklable(src: int, what: str, cause: BaseException | None) -> None:
    raise TypeError(
        f"broadcast(src={src}) failed: rank {src} could not pickle the object, a {what}. Broadcast a"
        " tensor or a picklable object (plain Python values, tensors, and collections of them)."
    ) from cause
