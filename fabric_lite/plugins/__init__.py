"""Plugins: precision, cluster environments and checkpoint IO (collectives: ``fabric_lite.plugins.collectives``)."""

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
from fabric_lite.plugins.precision import _LAZY as _PRECISION_LAZY
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

# the precision plugins imported on first use there (Lightning's former names of XLAPrecision among them)
__getattr__ = lazy_getattr(__name__, _PRECISION_LAZY)

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
