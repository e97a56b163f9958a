"""The Apple MPS accelerator."""

from __future__ import annotations

import platform

import torch
from typing_extensions import override

from fabric_lite.accelerators.accelerator import Accelerator, _Name
from fabric_lite.utilities._device_ids import parse_device_ids


class MPSAccelerator(Accelerator):
    """Compute on an Apple silicon GPU through Metal (one device).

    Example::

        fabric = Fabric(accelerator="mps", devices=1)
    """

    name = _Name("mps")

    @override
    def setup_device(self, device: torch.device) -> None:
        """Check that ``device`` is an MPS device (``ValueError`` otherwise); nothing to prepare."""
        if device.type != "mps":
            raise ValueError(
                f"Device should be MPS, got {device} instead: MPSAccelerator computes on torch.device('mps')."
            )

    @staticmethod
    @override
    def parse_devices(devices: int | str | list[int]) -> list[int] | None:
        """The MPS indices ``devices`` selects (there is one, 0), or ``None``; raising as
        :func:`fabric_lite.utilities.device_parser._parse_gpu_ids` does."""
        return parse_device_ids(devices, _get_all_available_mps_gpus())

    @staticmethod
    @override
    def get_parallel_devices(devices: int | str | list[int]) -> list[torch.device]:
        """One ``mps`` device per selected index."""
        return [torch.device("mps", i) for i in range(len(MPSAccelerator.parse_devices(devices) or []))]

    @staticmethod
    @override
    def is_available() -> bool:
        mps = getattr(torch.backends, "mps", None)
        return bool(mps is not None and mps.is_available() and platform.processor() in ("arm", "arm64"))

    @staticmethod
    @override
    def auto_device_count() -> int:
        return 1


def _get_all_available_mps_gpus() -> list[int]:
    """``[0]`` on a machine with an MPS device, else ``[]`` (Lightning Fabric's name in this module)."""
    return [0] if MPSAccelerator.is_available() else []
