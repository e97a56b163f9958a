"""The CUDA accelerator."""

from __future__ import annotations

import torch
from typing_extensions import override

from fabric_lite.accelerators.accelerator import Accelerator


class CUDAAccelerator(Accelerator):
    """Compute on NVIDIA GPUs through CUDA. ``devices`` selects GPU indices; each process drives one GPU.

    Example::

        fabric = Fabric(accelerator="cuda", devices=[0, 2])  # GPUs 0 and 2, one process each, NCCL between them
        fabric.launch()
        fabric.device  # rank 0: cuda:0   rank 1: cuda:2
    """

    name = "cuda"

    @override
    def setup_device(self, device: torch.device) -> None:
        if device.type != "cuda":
            raise ValueError(f"CUDAAccelerator cannot set up device {device}; expected a CUDA device.")
        torch.cuda.set_device(device)

    @override
    def teardown(self) -> None:
        if torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
            torch.cuda.empty_cache()

    @staticmethod
    @override
    def is_available() -> bool:
        return torch.cuda.device_count() > 0

    @staticmethod
    @override
    def auto_device_count() -> int:
        return torch.cuda.device_count()
