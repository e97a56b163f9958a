"""Lightning Fabric's ``utilities.device_parser``: :func:`~fabric_lite.utilities._device_ids.parse_device_ids` given
this machine's GPUs, read through ``accelerators.cuda`` and ``accelerators.mps`` (where tests patch them)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from fabric_lite.accelerators.cuda import _get_all_visible_cuda_devices
from fabric_lite.accelerators.mps import _get_all_available_mps_gpus
from fabric_lite.utilities._device_ids import (
    _check_data_type,
    _check_unique,
    _normalize_parse_gpu_string_input,
    check_available,
    parse_device_ids,
)
from fabric_lite.utilities.types import _DEVICE


def _determine_root_gpu_device(gpus: list[_DEVICE] | None) -> _DEVICE | None:
    """The first of ``gpus``, or ``None`` for ``None``.

    Raises:
        TypeError: ``gpus`` is not a list.
        ValueError: ``gpus`` is empty.
    """
    if gpus is None:
        return None
    if not isinstance(gpus, list):
        raise TypeError(f"GPUs should be a list, got {gpus!r}.")
    if not gpus:
        raise ValueError("GPUs should be a non-empty list, got [].")
    return gpus[0]


def _get_all_available_gpus(include_cuda: bool = False, include_mps: bool = False) -> list[int]:
    """The indices of this machine's visible CUDA devices and/or its MPS device."""
    cuda = _get_all_visible_cuda_devices() if include_cuda else []
    return cuda + (_get_all_available_mps_gpus() if include_mps else [])


def _sanitize_gpu_ids(gpus: list[int], include_cuda: bool = False, include_mps: bool = False) -> list[int]:
    """``gpus`` unchanged when each exists on this machine.

    Raises:
        ValueError: neither kind of GPU is included.
        MisconfigurationException: an index listed twice or missing.
    """
    if not (include_cuda or include_mps):
        raise ValueError("At least one gpu type should be specified! Pass include_cuda=True or include_mps=True.")
    return check_available(gpus, _get_all_available_gpus(include_cuda=include_cuda, include_mps=include_mps))


def _parse_gpu_ids(
    gpus: int | str | Sequence[int] | None, include_cuda: bool = False, include_mps: bool = False
) -> list[int] | None:
    """The GPU indices ``gpus`` selects on this machine (see the module's docstring); under torchelastic with one
    visible GPU per process, another count is taken as given.

    Raises:
        TypeError: a value that is not an int, a string or a sequence of ints.
        MisconfigurationException: a GPU that does not exist, an index listed twice, or GPUs where there are none.
    """
    launched = torch.distributed.is_available() and torch.distributed.is_torchelastic_launched()
    available = _get_all_available_gpus(include_cuda=include_cuda, include_mps=include_mps)
    return parse_device_ids(gpus, available, one_device_per_process=launched)  # type: ignore[arg-type]


__all__ = [
    "_check_data_type",
    "_check_unique",
    "_determine_root_gpu_device",
    "_get_all_available_gpus",
    "_normalize_parse_gpu_string_input",
    "_parse_gpu_ids",
    "_sanitize_gpu_ids",
]
