"""Collective plugins: ``torch.distributed``'s point-to-point and collective calls on a process group of their own.

Unlike ``fabric.all_reduce`` and friends (which walk collections and always use every process), a collective
owns one group, which may be a subset of the processes, and exposes torch's calls one to one.
"""

from fabric_lite.plugins.collectives.collective import Collective
from fabric_lite.plugins.collectives.single_device import SingleDeviceCollective
from fabric_lite.plugins.collectives.torch_collective import TorchCollective
from fabric_lite.utilities._lazy import lazy_getattr

__all__ = ["Collective", "SingleDeviceCollective", "TorchCollective"]

#: a module of the package as an attribute on first use (``strategies.launchers.xla``), as in Lightning
__getattr__ = lazy_getattr(__name__, {})
