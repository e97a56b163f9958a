"""The CPU accelerator."""

from __future__ import annotations

import torch
from typing_extensions import override

from fabric_lite.accelerators.accelerator import Accelerator


class CPUAccelerator(Accelerator):
    """Compute on the CPU. ``devices=N`` means N processes, each using the CPU.

    Example::

        fabric = Fabric(accelerator="cpu", devices=2, strategy="ddp")  # two processes, gloo between them
        fabric.accelerator  # CPUAccelerator()
    """

    name = "cpu"

    @override
    def setup_device(self, device: torch.device) -> None:
        if device.type != "cpu":
            raise ValueError(f"CPUAccelerator cannot set up device {device}; expected a CPU device.")

    @staticmethod
    @override
    def is_available() -> bool:
        return True

    @staticmethod
    @override
    def auto_device_count() -> int:
        return 1
