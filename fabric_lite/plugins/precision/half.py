"""True half precision: ``"16-true"`` and ``"bf16-true"``."""

from __future__ import annotations

from typing import Literal

import torch

from fabric_lite.plugins.precision.precision import _TrueDtypePrecision

_HALF = ("16-true", "bf16-true")


class HalfPrecision(_TrueDtypePrecision):
    """Everything in float16 (``"16-true"``) or bfloat16 (``"bf16-true"``), without loss scaling: floating parameters,
    buffers and inputs, and tensors created under ``init_module()``/``init_tensor()`` and in the forward; floating
    outputs come back in the default dtype, as in Lightning.

    Example::

        fabric = Fabric(plugins=[HalfPrecision("bf16-true")])  # the same as precision="bf16-true"
    """

    def __init__(self, precision: Literal["16-true", "bf16-true"] = "16-true") -> None:
        if precision not in _HALF:
            raise ValueError(f"HalfPrecision(precision={precision!r}): precision must be one of {_HALF}.")
        self.precision = precision
        self._desired_input_dtype = torch.bfloat16 if precision == "bf16-true" else torch.float16
