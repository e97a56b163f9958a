"""Functions that apply an operation to every tensor in a (nested) collection."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np
import torch
from torch import Tensor

from fabric_lite.utilities._tree import flatten, map_leaves, unflatten


def _from_numpy(value: np.ndarray[Any, Any], device: torch.device | str | int) -> Tensor:
    return torch.from_numpy(value).to(device)


#: ``(type, converter)`` pairs, in order, for :func:`convert_to_tensors`: Lightning Fabric's dtypes, so that results
#: are identical (bool -> uint8: NCCL cannot reduce bool tensors); NumPy arrays keep their dtype
CONVERSION_DTYPES: list[tuple[Any, Callable[..., Tensor]]] = [
    (bool, partial(torch.tensor, dtype=torch.uint8)),
    (int, partial(torch.tensor, dtype=torch.int)),
    (float, partial(torch.tensor, dtype=torch.float)),
    (np.ndarray, _from_numpy),
]

# Devices where a host-to-device copy with ``non_blocking=True`` gains nothing or is unsafe.
_BLOCKING_DEVICE_TYPES = ("cpu", "mps")


def apply_to_collection(
    data: Any, dtype: type | tuple[type, ...], function: Callable[..., Any], *args: Any, **kwargs: Any
) -> Any:
    """Apply ``function(leaf, *args, **kwargs)`` to every leaf of ``data`` that is an instance of ``dtype``.

    Mappings, lists, tuples, namedtuples and dataclasses are rebuilt with their types; other leaves are kept.

    Example::

        >>> apply_to_collection({"a": 1, "b": [2, "x"]}, int, lambda x: x * 10)
        {'a': 10, 'b': [20, 'x']}
    """
    return map_leaves(data, lambda leaf: function(leaf, *args, **kwargs) if isinstance(leaf, dtype) else leaf)


def _move(leaf: Any, device: torch.device, non_blocking: bool) -> Any:
    if isinstance(leaf, Tensor):
        return leaf if leaf.device == device else leaf.to(device, non_blocking=non_blocking)
    to = getattr(leaf, "to", None)
    if callable(to) and not isinstance(leaf, type):
        # any object with a ``.to(device)`` method, as in Lightning (e.g. a custom batch class); one that moves
        # itself in place and forgets to return ``self`` is kept, not replaced by ``None``
        moved = to(device)
        return leaf if moved is None else moved
    return leaf


def move_data_to_device(batch: Any, device: torch.device | str | int) -> Any:
    """Move every tensor (and object with ``.to(device)``) in ``batch`` to ``device``; host-to-CUDA copies don't block.

    Example::

        >>> move_data_to_device({"x": torch.zeros(2)}, "cpu")["x"].device
        device(type='cpu')
    """
    device = torch.device(device)
    non_blocking = device.type not in _BLOCKING_DEVICE_TYPES
    if isinstance(batch, Tensor):
        return _move(batch, device, non_blocking)
    leaves, spec = flatten(batch)
    return unflatten(spec, [_move(leaf, device, non_blocking) for leaf in leaves])


def _to_tensor(leaf: Any, device: torch.device, non_blocking: bool) -> Any:
    if not isinstance(leaf, Tensor):
        for kind, convert in CONVERSION_DTYPES:
            if isinstance(leaf, kind):
                return convert(leaf, device=device)
    return _move(leaf, device, non_blocking)


def convert_to_tensors(data: Any, device: torch.device | str | int) -> Any:
    """Make Python numbers and NumPy arrays in ``data`` tensors on ``device``, and move tensors there.

    As in Lightning, ``bool`` becomes ``uint8``, ``int`` ``int32`` and ``float`` ``float32``; other leaves are kept.

    Example::

        >>> convert_to_tensors({"n": 3, "x": 0.5}, "cpu")
        {'n': tensor(3, dtype=torch.int32), 'x': tensor(0.5000)}
    """
    device = torch.device(device)
    if isinstance(data, Tensor):
        return _move(data, device, device.type not in _BLOCKING_DEVICE_TYPES)
    leaves, spec = flatten(data)
    converted = convert_leaves(leaves, device)
    return data if converted is leaves else unflatten(spec, converted)


def convert_leaves(leaves: list[Any], device: torch.device) -> list[Any]:
    """:func:`convert_to_tensors` for a flat list of leaves; the same list object when nothing changes.

    Example::

        >>> convert_leaves([1, 0.5], torch.device("cpu"))
        [tensor(1, dtype=torch.int32), tensor(0.5000)]
    """
    non_blocking = device.type not in _BLOCKING_DEVICE_TYPES
    # the common leaf, a tensor already on the device, is decided inline (no call per leaf)
    converted = [
        leaf if type(leaf) is Tensor and leaf.device == device else _to_tensor(leaf, device, non_blocking)
        for leaf in leaves
    ]
    if all(new is old for new, old in zip(converted, leaves, strict=True)):
        return leaves  # nothing to convert or move: no need to rebuild anything
    return converted


def convert_tensors_to_scalars(data: Any) -> Any:
    """Replace every one-element tensor in ``data`` by ``tensor.item()``; raises ``ValueError`` for other tensors.

    Example::

        >>> convert_tensors_to_scalars({"loss": torch.tensor(0.5)})
        {'loss': 0.5}
    """

    def to_item(value: Tensor) -> int | float | bool:
        if value.numel() != 1:
            raise ValueError(
                f"The metric `{value}` does not contain a single element, thus it cannot be converted to a scalar."
            )
        return value.item()

    return apply_to_collection(data, Tensor, to_item)
