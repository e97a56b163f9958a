"""Accelerators: the kinds of device fabric_lite computes on. ``ACCELERATORS`` maps the names it runs on to classes;
``ACCELERATOR_REGISTRY`` holds those and Lightning's ``"tpu"``, each registered by its class, as in Lightning."""

from fabric_lite.accelerators.accelerator import Accelerator
from fabric_lite.accelerators.cpu import CPUAccelerator
from fabric_lite.accelerators.cuda import CUDAAccelerator, find_usable_cuda_devices
from fabric_lite.accelerators.mps import MPSAccelerator
from fabric_lite.accelerators.registry import _AcceleratorRegistry
from fabric_lite.accelerators.xla import XLAAccelerator
from fabric_lite.utilities._lazy import lazy_getattr

# Lightning's former name, deprecated: imported when asked for
__getattr__ = lazy_getattr(__name__, {"TPUAccelerator": "fabric_lite.accelerators.tpu"})

#: the built-in accelerators by name (what ``Fabric(accelerator="cuda")`` builds)
ACCELERATORS: dict[str, type[Accelerator]] = {
    cls.name: cls for cls in (CPUAccelerator, CUDAAccelerator, MPSAccelerator)
}

ACCELERATOR_REGISTRY = _AcceleratorRegistry()
_REGISTERED: list[type[Accelerator]] = [*ACCELERATORS.values(), XLAAccelerator]
for _cls in _REGISTERED:
    _cls.register_accelerators(ACCELERATOR_REGISTRY)

__all__ = [
    "ACCELERATORS",
    "ACCELERATOR_REGISTRY",
    "Accelerator",
    "CPUAccelerator",
    "CUDAAccelerator",
    "MPSAccelerator",
    "XLAAccelerator",
    "find_usable_cuda_devices",
]
