"""Moving optimizer state between devices (Lightning Fabric's private ``utilities.optimizer``)."""

from __future__ import annotations

from collections.abc import Iterable, MutableMapping

from torch import Tensor
from torch.optim import Optimizer

from fabric_lite.utilities.apply_func import apply_to_collection, move_data_to_device
from fabric_lite.utilities.types import _DEVICE


def _optimizers_to_device(optimizers: Iterable[Optimizer], device: _DEVICE) -> None:
    """:func:`_optimizer_to_device` for each optimizer."""
    for optimizer in optimizers:
        _optimizer_to_device(optimizer, device)


def _optimizer_to_device(optimizer: Optimizer, device: _DEVICE) -> None:
    """Move the tensors of ``optimizer``'s state to ``device``, in place, except each ``step``, which optimizers keep on
    the CPU on purpose."""
    for param, state in optimizer.state.items():
        if not isinstance(state, MutableMapping):  # a custom optimizer's own structure
            optimizer.state[param] = apply_to_collection(state, Tensor, move_data_to_device, device)
            continue
        for key, value in state.items():
            if key != "step":
                state[key] = move_data_to_device(value, device)
