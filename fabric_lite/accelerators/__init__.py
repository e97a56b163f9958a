"""Accelerators: the kinds of device fabric_lite computes on."""

from fabric_lite.accelerators.accelerator import Accelerator
from fabric_lite.accelerators.cpu import CPUAccelerator
from fabric_lite.accelerators.cuda import CUDAAccelerator
from fabric_lite.accelerators.mps import MPSAccelerator

ACCELERATORS: dict[str, type[Accelerator]] = {
    "cpu": CPUAccelerator,
    "cuda": CUDAAccelerator,
    "mps": MPSAccelerator,
}

__all__ = ["ACCELERATORS", "Accelerator", "CPUAccelerator", "CUDAAccelerator", "MPSAccelerator"]
