"""Cluster environments: where a process's ranks come from."""

from fabric_lite.plugins.environments.cluster_environment import ClusterEnvironment
from fabric_lite.plugins.environments.kubeflow import KubeflowEnvironment
from fabric_lite.plugins.environments.lightning import LightningEnvironment
from fabric_lite.plugins.environments.lsf import LSFEnvironment
from fabric_lite.plugins.environments.mpi import MPIEnvironment
from fabric_lite.plugins.environments.slurm import SLURMEnvironment
from fabric_lite.plugins.environments.torchelastic import TorchElasticEnvironment
from fabric_lite.plugins.environments.xla import XLAEnvironment

__all__ = [
    "ClusterEnvironment",
    "KubeflowEnvironment",
    "LSFEnvironment",
    "LightningEnvironment",
    "MPIEnvironment",
    "SLURMEnvironment",
    "TorchElasticEnvironment",
    "XLAEnvironment",
]
