"""Plugins: precision, cluster environments and checkpoint IO (collectives: ``fabric_lite.plugins.collectives``).

``BitsandbytesPrecision`` is imported on first use (it is the door to the optional ``bitsandbytes``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fabric_lite.plugins.environments import (
    ClusterEnvironment,
    LightningEnvironment,
    SLURMEnvironment,
    TorchElasticEnvironment,
    XLAEnvironment,
)
from fabric_lite.plugins.io import AsyncCheckpointIO, CheckpointIO, TorchCheckpointIO, XLACheckpointIO
from fabric_lite.plugins.precision import (
    DeepSpeedPrecision,
    DoublePrecision,
    FSDPPrecision,
    HalfPrecision,
    MixedPrecision,
    Precision,
    TransformerEnginePrecision,
    XLAPrecision,
)
from fabric_lite.utilities._lazy import lazy_getattr

if TYPE_CHECKING:
    from fabric_lite.plugins.precision.bitsandbytes import BitsandbytesPrecision

# Lightning's former names of XLAPrecision, deprecated, are imported when asked for too
__getattr__ = lazy_getattr(
    __name__,
    {
        "BitsandbytesPrecision": "fabric_lite.plugins.precision.bitsandbytes",
        "TPUBf16Precision": "fabric_lite.plugins.precision.tpu_bf16",
        "TPUPrecision": "fabric_lite.plugins.precision.tpu",
        "XLABf16Precision": "fabric_lite.plugins.precision.xlabf16",
    },
)

__all__ = [
    "AsyncCheckpointIO",
    "BitsandbytesPrecision",
    "CheckpointIO",
    "ClusterEnvironment",
    "DeepSpeedPrecision",
    "DoublePrecision",
    "FSDPPrecision",
    "HalfPrecision",
    "LightningEnvironment",
    "MixedPrecision",
    "Precision",
    "SLURMEnvironment",
    "TorchCheckpointIO",
    "TorchElasticEnvironment",
    "TransformerEnginePrecision",
    "XLACheckpointIO",
    "XLAEnvironment",
    "XLAPrecision",
]
