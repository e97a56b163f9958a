"""What the precision plugins share (Lightning Fabric's ``plugins.precision.utils``, whose names clients import)."""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor
from torch.nn import Module

from fabric_lite.utilities.apply_func import apply_to_collection


def _convert_fp_tensor(tensor: Tensor, dst_type: torch.dtype | str) -> Tensor:
    """``tensor`` cast to ``dst_type`` if it is floating; any other tensor (integer, bool, complex) unchanged."""
    return tensor.to(dst_type) if torch.is_floating_point(tensor) else tensor


def _cast_floating(data: Any, dtype: torch.dtype) -> Any:
    """Every floating tensor in ``data`` (a tensor or a collection) cast to ``dtype``; everything else as it is."""
    if isinstance(data, Tensor):
        return _convert_fp_tensor(data, dtype)
    return apply_to_collection(data, Tensor, _convert_fp_tensor, dtype)


def _convert_module(module: Module, dtype: torch.dtype) -> Module:
    """``module`` (in place, and returned) with its floating parameters and buffers in ``dtype``; the others are kept
    (``module.to(dtype=...)`` would keep only the real part of complex ones)."""
    # Module._apply is what module.double() and module.half() run: parameters, their gradients and buffers alike
    module._apply(lambda t: _convert_fp_tensor(t, dtype))  # type: ignore[no-untyped-call]
    return module


class _DtypeContextManager:
    """Set the default floating dtype inside the block and restore it afterwards, also on error; reentrant."""

    def __init__(self, dtype: torch.dtype) -> None:
        self._dtype = dtype
        self._previous: list[torch.dtype] = []

    def __enter__(self) -> None:
        self._previous.append(torch.get_default_dtype())
        torch.set_default_dtype(self._dtype)

    def __exit__(self, *exc: object) -> None:
        torch.set_default_dtype(self._previous.pop())


class _ClassReplacementContextManager:
    """Inside the block, each class named in ``mapping`` (``"module.path.ClassName"``) is replaced in its module, so
    that unmodified model code creates the replacement (quantised ``Linear`` layers); restored on exit, also on error.
    The modules are imported at construction, so a wrong name fails there."""

    def __init__(self, mapping: Mapping[str, type]) -> None:
        self._mapping = dict(mapping)
        #: the class each name stands for outside the block, and the module that holds it
        self._originals: dict[str, type] = {}
        self._modules: dict[str, Any] = {}
        for path in self._mapping:
            module_name, _, class_name = path.rpartition(".")
            if not module_name:
                raise ValueError(
                    f"_ClassReplacementContextManager: {path!r} is not a dotted path to a class; write it as"
                    " 'package.module.ClassName', e.g. 'torch.nn.Linear'."
                )
            module = importlib.import_module(module_name)
            self._modules[path] = module
            self._originals[path] = getattr(module, class_name)

    def __enter__(self) -> None:
        for path, replacement in self._mapping.items():
            setattr(self._modules[path], path.rpartition(".")[2], replacement)

    def __exit__(self, *exc: object) -> None:
        for path, original in self._originals.items():
            setattr(self._modules[path], path.rpartition(".")[2], original)
