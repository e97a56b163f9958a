"""The Apple MPS accelerator."""

from __future__ import annotations

import platform

import torch
from typing_extensions import override

from fabric_lite.accelerators.accelerator import Accelerator


class MPSAccelerator(Accelerator):
    """Compute on an Apple silicon GPU through Metal (one device).

    Example::

        if MPSAccelerator.is_available():  # a Mac with Apple silicon
            fabric = Fabric(accelerator="mps", devices=1)
    """

    name = "mps"

    @override
    def setup_device(self, device: torch.device) -> None:
        if device.type != "mps":
            raise ValueError(f"MPSAccelerator cannot set up device {device}; expected an MPS device.")

    @staticmethod
    @override
    def is_available() -> bool:
        mps = getattr(torch.backends, "mps", None)
        return bool(mps is not None and mps.is_available() and platform.processor() in ("arm", "arm64"))

    @staticmethod
    @override
    def auto_device_count() -> int:
        return 1
