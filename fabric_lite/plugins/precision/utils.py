"""What the precision plugins share: casting floating tensors, and the default dtype inside a block (Lightning
Fabric's ``plugins.precision.utils``, whose names clients import)."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from fabric_lite.utilities.apply_func import apply_to_collection


def _convert_fp_tensor(tensor: Tensor, dst_type: torch.dtype | str) -> Tensor:
    """``tensor`` cast to ``dst_type`` if it is floating; any other tensor (integer, bool, complex) unchanged."""
    return tensor.to(dst_type) if torch.is_floating_point(tensor) else tensor


def _cast_floating(data: Any, dtype: torch.dtype) -> Any:
    """Every floating tensor in ``data`` (a tensor or a collection) cast to ``dtype``; everything else as it is."""
    if isinstance(data, Tensor):
        return _convert_fp_tensor(data, dtype)
    return apply_to_collection(data, Tensor, _convert_fp_tensor, dtype)


class _DtypeContextManager:
    """Set the default floating dtype inside the block and restore it afterwards, also on error; reentrant (the
    same instance can be entered again inside itself, or after it exited).

    Example::

        with _DtypeContextManager(torch.float64):
            torch.empty(1).dtype  # torch.float64
    """

    def __init__(self, dtype: torch.dtype) -> None:
        self._dtype = dtype
        self._previous: list[torch.dtype] = []

    def __enter__(self) -> None:
        self._previous.append(torch.get_default_dtype())
        torch.set_default_dtype(self._dtype)

    def __exit__(self, *exc: object) -> None:
        torch.set_default_dtype(self._previous.pop())
