"""The CUDA accelerator."""

from __future__ import annotations

from functools import lru_cache

import torch
from typing_extensions import override

from fabric_lite.accelerators.accelerator import Accelerator, _Name
from fabric_lite.utilities._device_ids import parse_device_ids
from fabric_lite.utilities.rank_zero import rank_zero_info


class CUDAAccelerator(Accelerator):
    """Compute on NVIDIA GPUs through CUDA: ``devices`` selects GPU indices, one process each.

    Example::

        fabric = Fabric(accelerator="cuda", devices=[0, 2])  # rank 0 on cuda:0, rank 1 on cuda:2
    """

    name = _Name("cuda")

    @override
    def setup_device(self, device: torch.device) -> None:
        """Make ``device`` the current CUDA device (``ValueError`` if it is not one), saying once how to use Tensor
        Cores that float32 matmuls leave unused."""
        if device.type != "cuda":
            raise ValueError(
                f"Device should be CUDA, got {device} instead: CUDAAccelerator computes on torch.device('cuda', i)."
            )
        _check_cuda_matmul_precision(device)
        torch.cuda.set_device(device)

    @override
    def teardown(self) -> None:
        if torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
            torch.cuda.empty_cache()

    @staticmethod
    @override
    def parse_devices(devices: int | str | list[int]) -> list[int] | None:
        """The visible GPU indices ``devices`` selects, or ``None``; raising as
        :func:`fabric_lite.utilities.device_parser._parse_gpu_ids` does."""
        launched = torch.distributed.is_available() and torch.distributed.is_torchelastic_launched()
        return parse_device_ids(devices, _get_all_visible_cuda_devices(), one_device_per_process=launched)

    @staticmethod
    @override
    def get_parallel_devices(devices: list[int]) -> list[torch.device]:
        """One ``cuda`` device per index."""
        return [torch.device("cuda", i) for i in devices]

    @staticmethod
    @override
    def is_available() -> bool:
        return is_cuda_available()

    @staticmethod
    @override
    def auto_device_count() -> int:
        return num_cuda_devices()


def num_cuda_devices() -> int:
    """How many CUDA devices this process sees (Lightning Fabric's name in this module)."""
    return torch.cuda.device_count()


def _get_all_visible_cuda_devices() -> list[int]:
    """The indices of the CUDA devices this process sees (``CUDA_VISIBLE_DEVICES`` renumbers them from 0)."""
    return list(range(num_cuda_devices()))


def is_cuda_available() -> bool:
    """Whether this process sees a CUDA device (Lightning Fabric's name in this module)."""
    return num_cuda_devices() > 0


def _is_ampere_or_later(device: torch.device | None = None) -> bool:
    """Whether the CUDA device (default: current) has compute capability >= 8, with TF32 tensor cores (Lightning's)."""
    major, _ = torch.cuda.get_device_capability(device)
    return major >= 8


def find_usable_cuda_devices(num_devices: int = -1) -> list[int]:
    """The first ``num_devices`` visible GPUs (all with ``-1``) that accept a tensor now, e.g. not taken by a process
    in exclusive mode; processes calling it at the same time may pick the same GPU.

    Raises:
        ValueError: there is no visible GPU, or fewer than ``num_devices``.
        RuntimeError: fewer than ``num_devices`` are usable now; the message names the occupied ones.

    Example::

        fabric = Fabric(accelerator="cuda", devices=find_usable_cuda_devices(2))
    """
    if num_devices == 0:
        return []
    visible = _get_all_visible_cuda_devices()
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


@lru_cache(1)  # said once per process
def _check_cuda_matmul_precision(device: torch.device) -> None:
    """Say how to use an Ampere-or-later GPU's Tensor Cores, which float32 matmuls leave unused at torch's default."""
    if not torch.cuda.is_available() or torch.cuda.get_device_capability(device)[0] < 8:
        return
    if torch.get_float32_matmul_precision() == "highest":
        rank_zero_info(
            f"This process computes on a CUDA device ({torch.cuda.get_device_name(device)!r}) that has Tensor Cores,"
            " which float32 matrix products leave unused at torch's default precision: call"
            " `torch.set_float32_matmul_precision('high')` (or 'medium') to trade a little precision for speed. See"
            " https://pytorch.org/docs/stable/generated/torch.set_float32_matmul_precision.html"
        )
