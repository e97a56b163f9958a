"""Double precision: ``"64-true"``."""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any

import torch
from torch.nn import Module
from typing_extensions import override

from fabric_lite.plugins.precision.precision import Precision, _convert_fp_tensor, _DtypeContext
from fabric_lite.utilities.apply_func import apply_to_collection


class DoublePrecision(Precision):
    """Train in ``float64``: parameters, buffers and floating inputs become float64, new tensors created under
    ``fabric.init_module()``/``init_tensor()`` and inside the forward default to float64, and floating outputs
    come back in the default dtype (float32), as in Lightning Fabric."""

    precision = "64-true"

    @override
    def convert_module(self, module: Module) -> Module:
        return module.double()

    @override
    def tensor_init_context(self) -> AbstractContextManager[Any]:
        return _DtypeContext(torch.float64)

    @override
    def module_init_context(self) -> AbstractContextManager[Any]:
        return _DtypeContext(torch.float64)

    @override
    def forward_context(self) -> AbstractContextManager[Any]:
        return _DtypeContext(torch.float64)

    @override
    def convert_input(self, data: Any) -> Any:
        return apply_to_collection(data, torch.Tensor, _convert_fp_tensor, torch.float64)

    @override
    def convert_output(self, data: Any) -> Any:
        return apply_to_collection(data, torch.Tensor, _convert_fp_tensor, torch.get_default_dtype())
