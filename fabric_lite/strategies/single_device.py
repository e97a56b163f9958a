"""One process on one device."""

from __future__ import annotations

from typing import Any

import torch
from typing_extensions import override

from fabric_lite.accelerators import Accelerator
from fabric_lite.plugins.io.checkpoint_io import CheckpointIO
from fabric_lite.plugins.precision import Precision
from fabric_lite.strategies.strategy import Strategy, _takes_collections
from fabric_lite.utilities.types import ReduceOp, TBroadcast, TReduce


class SingleDeviceStrategy(Strategy):
    """Run in this process on one device. Collectives are identities and ``barrier`` does nothing.

    Args:
        device: the device to compute on, e.g. ``"cpu"`` or ``"cuda:0"``.
        accelerator, checkpoint_io, precision: as for :class:`Strategy`.

    Example::

        fabric = Fabric(strategy=SingleDeviceStrategy("cuda:1"))
    """

    def __init__(
        self,
        device: torch.device | str | int = "cpu",
        accelerator: Accelerator | None = None,
        checkpoint_io: CheckpointIO | None = None,
        precision: Precision | None = None,
    ) -> None:
        super().__init__(accelerator=accelerator, checkpoint_io=checkpoint_io, precision=precision)
        if isinstance(device, int):
            device = torch.device("cuda", device)
        self._root_device = device if isinstance(device, torch.device) else torch.device(device)

    @classmethod
    @override
    def _create(cls, devices: list[torch.device], **kwargs: Any) -> Strategy:
        return cls(devices[0], **kwargs)

    @property
    @override
    def root_device(self) -> torch.device:
        return self._root_device

    @override
    @_takes_collections
    def all_reduce(
        self, tensor: TReduce, group: Any | None = None, reduce_op: str | ReduceOp | None = "mean"
    ) -> TReduce:
        """Return ``tensor`` unchanged: with one process, every reduction is the identity."""
        return tensor

    @override
    @_takes_collections
    def all_gather(self, tensor: Any, group: Any | None = None, sync_grads: bool = False) -> Any:
        """Return ``tensor`` unchanged: with a world size of 1 no leading dimension is added (as documented)."""
        return tensor

    @override
    def broadcast(self, obj: TBroadcast, src: int = 0) -> TBroadcast:
        """Return ``obj`` unchanged."""
        return obj

    @override
    def barrier(self, name: str | None = None) -> None:
        """Nothing to wait for."""
