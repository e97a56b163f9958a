"""Lightning Fabric's ``TransformerEnginePrecision``: importable, an error when built.

NVIDIA's Transformer Engine (FP8 on Hopper-class GPUs) is not something fabric_lite drives; the name exists so that
code written for Lightning Fabric imports, and building it says what is missing.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from fabric_lite.plugins.precision.precision import Precision
from fabric_lite.utilities.imports import _Availability

_TRANSFORMER_ENGINE_AVAILABLE = _Availability("transformer_engine", "0.11.0")


class TransformerEnginePrecision(Precision):
    """FP8 through NVIDIA's Transformer Engine, which fabric_lite does not support: ``bf16-mixed`` is the nearest.

    Example::

        TransformerEnginePrecision(weights_dtype=torch.bfloat16)
        # ModuleNotFoundError: TransformerEnginePrecision needs NVIDIA's transformer_engine ...
    """

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        missing = "" if _TRANSFORMER_ENGINE_AVAILABLE else f" ({_TRANSFORMER_ENGINE_AVAILABLE})"
        raise (ModuleNotFoundError if missing else NotImplementedError)(
            f"{cls.__name__} needs NVIDIA's transformer_engine and a Hopper-class GPU{missing}, and fabric_lite has"
            " no Transformer Engine integration: use precision='bf16-mixed', or Lightning Fabric for FP8."
        )

    def __init__(
        self,
        *,
        weights_dtype: torch.dtype,
        recipe: Mapping[str, Any] | Any | None = None,
        replace_layers: bool | None = None,
        fallback_compute_dtype: torch.dtype | None = None,
    ) -> None:
        """Lightning's signature; building one raises (``__new__``)."""


__all__ = ["TransformerEnginePrecision"]
