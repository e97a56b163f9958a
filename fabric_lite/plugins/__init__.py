"""Plugins: precision, cluster environments and checkpoint IO (collectives: ``fabric_lite.plugins.collectives``).

``BitsandbytesPrecision`` is imported on first use (it is the door to the optional ``bitsandbytes``).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from fabric_lite.plugins.environments import (
    ClusterEnvironment,
    LightningEnvironment,
    SLURMEnvironment,
    TorchElasticEnvironment,
)
from fabric_lite.plugins.io import CheckpointIO, TorchCheckpointIO
from fabric_lite.plugins.precision import (
    DeepSpeedPrecision,
    DoublePrecision,
    FSDPPrecision,
    HalfPrecision,
    MixedPrecision,
    Precision,
)

if TYPE_CHECKING:
    from fabric_lite.plugins.precision.bitsandbytes import BitsandbytesPrecision

_LAZY = {"BitsandbytesPrecision": "fabric_lite.plugins.precision.bitsandbytes"}

__all__ = [
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
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
