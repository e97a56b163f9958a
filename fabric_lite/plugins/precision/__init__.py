"""Precision plugins: full, double, mixed and true half precision, 8- and 4-bit weights, FP8 through Transformer
Engine, and DeepSpeed's. ``BitsandbytesPrecision`` is imported on first use (the door to optional ``bitsandbytes``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fabric_lite.plugins.precision.amp import MixedPrecision
from fabric_lite.plugins.precision.deepspeed import DeepSpeedPrecision
from fabric_lite.plugins.precision.double import DoublePrecision
from fabric_lite.plugins.precision.fsdp import FSDPPrecision
from fabric_lite.plugins.precision.half import HalfPrecision
from fabric_lite.plugins.precision.precision import Precision
from fabric_lite.plugins.precision.transformer_engine import TransformerEnginePrecision
from fabric_lite.plugins.precision.xla import XLAPrecision
from fabric_lite.utilities._lazy import lazy_getattr

if TYPE_CHECKING:
    from fabric_lite.plugins.precision.bitsandbytes import BitsandbytesPrecision

#: what is imported on first use, here and in ``fabric_lite.plugins``; Lightning's former names of XLAPrecision,
#: deprecated, are imported when asked for too
_LAZY = {
    "BitsandbytesPrecision": "fabric_lite.plugins.precision.bitsandbytes",
    "TPUBf16Precision": "fabric_lite.plugins.precision.tpu_bf16",
    "TPUPrecision": "fabric_lite.plugins.precision.tpu",
    "XLABf16Precision": "fabric_lite.plugins.precision.xlabf16",
}
__getattr__ = lazy_getattr(__name__, _LAZY)

__all__ = [
    "BitsandbytesPrecision",
    "DeepSpeedPrecision",
    "DoublePrecision",
    "FSDPPrecision",
    "HalfPrecision",
    "MixedPrecision",
    "Precision",
    "TransformerEnginePrecision",
    "XLAPrecision",
]
