"""Collective plugins: ``torch.distributed``'s calls one to one, on a group of their own that may be a subset of the
processes (``fabric.all_reduce`` and friends walk collections and always use every process)."""

from fabric_lite.plugins.collectives.collective import Collective
from fabric_lite.plugins.collectives.single_device import SingleDeviceCollective
from fabric_lite.plugins.collectives.torch_collective import TorchCollective
from fabric_lite.utilities._lazy import lazy_getattr

__all__ = ["Collective", "SingleDeviceCollective", "TorchCollective"]

#: a module of the package as an attribute on first use (``strategies.launchers.xla``), as in Lightning
__getattr__ = lazy_getattr(__name__, {})
