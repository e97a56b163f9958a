"""Plugins: precision, cluster environments and checkpoint IO (collectives: ``fabric_lite.plugins.collectives``)."""

from fabric_lite.plugins.environments import (
    ClusterEnvironment,
    LightningEnvironment,
    SLURMEnvironment,
    TorchElasticEnvironment,
)
from fabric_lite.plugins.io import CheckpointIO, TorchCheckpointIO
from fabric_lite.plugins.precision import DoublePrecision, FSDPPrecision, HalfPrecision, MixedPrecision, Precision

__all__ = [
    "CheckpointIO",
    "ClusterEnvironment",
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
