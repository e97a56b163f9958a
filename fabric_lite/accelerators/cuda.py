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
        return is_cuda_available()

    @staticmethod
    @override
    def auto_device_count() -> int:
        return num_cuda_devices()


def num_cuda_devices() -> int:
    """How many CUDA devices this process sees (Lightning Fabric's name in this module).

    Example::

        num_cuda_devices()  # 0 on a machine without a GPU
    """
    return torch.cuda.device_count()


def is_cuda_available() -> bool:
    """Whether this process sees a CUDA device (Lightning Fabric's name in this module)."""
    return num_cuda_devices() > 0


def _is_ampere_or_later(device: torch.device | None = None) -> bool:
    """Whether the CUDA device (default: the current one) is of compute capability 8 or later (Ampere and newer),
    whose tensor cores run float32 matmuls as TF32 unless ``torch.get_float32_matmul_precision() == "highest"``
    (Lightning Fabric's private name, which ``get_available_flops`` asks).

    Example::

        _is_ampere_or_later(torch.device("cuda", 0))  # True on an A100 or H100, False on a V100 or T4
    """
    major, _ = torch.cuda.get_device_capability(device)
    return major >= 8


def find_usable_cuda_devices(num_devices: int = -1) -> list[int]:
    """The indices of visible CUDA GPUs that accept a tensor right now (e.g. not taken by another process in
    exclusive mode), the first ``num_devices`` of them, or all with ``-1``.

    Processes that call it at the same time may both find the same GPU free.

    Raises:
        ValueError: GPUs are requested but there is none, or fewer than ``num_devices`` are visible.
        RuntimeError: fewer than ``num_devices`` are usable now; the message names the occupied ones.

    Example::

        fabric = Fabric(accelerator="cuda", devices=find_usable_cuda_devices(2))
    """
    if num_devices == 0:
        return []
    visible = list(range(torch.cuda.device_count()))
    if not visible:
        raise ValueError(
            f"You requested to find {num_devices} devices but there are no visible CUDA devices on this machine."
        )
    if num_devices > len(visible):
        raise ValueError(f"You requested to find {num_devices} devices but this machine only has {len(visible)} GPUs.")
    usable: list[int] = []
    occupied: list[int] = []
    for index in visible:
        try:
            torch.tensor(0, device=torch.device("cuda", index))
        except RuntimeError:
            occupied.append(index)
            continue
        usable.append(index)
        if len(usable) == num_devices:
            break
    if num_devices != -1 and len(usable) != num_devices:
        raise RuntimeError(
            f"You requested to find {num_devices} devices but only {len(usable)} are currently available."
            f" The devices {occupied} are occupied by other processes and can't be used at the moment."
        )
    return usable
