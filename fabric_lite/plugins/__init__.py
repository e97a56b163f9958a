"""Plugins: precision and cluster environments."""

from fabric_lite.plugins.environments import (
    ClusterEnvironment,
    LightningEnvironment,
    SLURMEnvironment,
    TorchElasticEnvironment,
)
from fabric_lite.plugins.precision import DoublePrecision, HalfPrecision, MixedPrecision, Precision

__all__ = [
    "ClusterEnvironment",
    "DoublePrecision",
    "HalfPrecision",
    "LightningEnvironment",
    "MixedPrecision",
    "Precision",
    "SLURMEnvironment",
    "TorchElasticEnvironment",
]
