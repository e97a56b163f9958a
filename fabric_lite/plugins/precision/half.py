"""True half precision: ``"16-true"`` and ``"bf16-true"``."""

from __future__ import annotations

from typing import Literal

import torch

from fabric_lite.plugins.precision.precision import _TrueDtypePrecision

_HALF = ("16-true", "bf16-true")


class HalfPrecision(_TrueDtypePrecision):
    """Everything in float16 (``"16-true"``) or bfloat16 (``"bf16-true"``): floating parameters and buffers (complex
    and integer ones keep their dtype), floating inputs, tensors created under ``fabric.init_module()``/
    ``init_tensor()`` and inside the forward. Floating outputs come back in the default dtype, as in Lightning
    Fabric. No loss scaling.

    Args:
        precision: ``"16-true"`` or ``"bf16-true"``.

    Example::

        fabric = Fabric(plugins=[HalfPrecision("bf16-true")])  # the same as precision="bf16-true"
        model = fabric.setup(torch.nn.Linear(2, 1))
        model.weight.dtype  # torch.bfloat16
        model(torch.ones(2)).dtype  # torch.float32
    """

    def __init__(self, precision: Literal["16-true", "bf16-true"] = "16-true") -> None:
        if precision not in _HALF:
            raise ValueError(f"HalfPrecision(precision={precision!r}): precision must be one of {_HALF}.")
        self.precision = precision
        self._desired_input_dtype = torch.bfloat16 if precision == "bf16-true" else torch.float16
