"""Public distributed utilities (the seed's ``pytorch_lightning.utilities.distributed``)."""

from __future__ import annotations

from typing import Any

import torch.distributed as dist
from torch import Tensor

from fabric_lite.utilities import _collectives


def _distributed_is_initialized() -> bool:
    return dist.is_available() and dist.is_initialized()


def gather_all_tensors(result: Tensor, group: Any | None = None) -> list[Tensor]:
    """Gather a tensor from every process when the shapes differ across processes.

    Works on tensors with the same number of dimensions (and dtype) everywhere, whatever their sizes: the sizes are
    gathered, every tensor is padded to the largest, gathered, and trimmed back. Every process must call it.

    Returns:
        A list with one tensor per rank of ``group``, ``result[i]`` being rank ``i``'s tensor with its own shape.
        Without a process group: ``[result]``.

    Raises:
        ValueError: on every process, when the number of dimensions or the dtype differs between processes.

    Example::

        # rank 0: torch.tensor([1, 2])      rank 1: torch.tensor([3])
        gather_all_tensors(t)  # every rank: [tensor([1, 2]), tensor([3])]
    """
    if not _distributed_is_initialized():
        return [result]
    return _collectives.gather_uneven(result, group)
