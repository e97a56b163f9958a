"""Cluster environments: where a process's ranks come from."""

from fabric_lite.plugins.environments.cluster_environment import ClusterEnvironment
from fabric_lite.plugins.environments.lightning import LightningEnvironment
from fabric_lite.plugins.environments.slurm import SLURMEnvironment
from fabric_lite.plugins.environments.torchelastic import TorchElasticEnvironment

__all__ = ["ClusterEnvironment", "LightningEnvironment", "SLURMEnvironment", "TorchElasticEnvironment"]
