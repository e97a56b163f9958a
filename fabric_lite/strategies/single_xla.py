"""Lightning Fabric's ``SingleDeviceXLAStrategy``: importable, an error when built."""

from __future__ import annotations

import torch

from fabric_lite.accelerators.accelerator import Accelerator
from fabric_lite.accelerators.xla import _XLA_AVAILABLE as _XLA_AVAILABLE  # Lightning's name here (tests patch it)
from fabric_lite.accelerators.xla import _NeedsXLA
from fabric_lite.plugins.io.xla import XLACheckpointIO
from fabric_lite.plugins.precision.xla import XLAPrecision
from fabric_lite.strategies.single_device import SingleDeviceStrategy


class SingleDeviceXLAStrategy(_NeedsXLA, SingleDeviceStrategy):
    """One XLA device (a TPU core), which fabric_lite does not run on.

    Example::

        SingleDeviceXLAStrategy(0)  # ModuleNotFoundError: SingleDeviceXLAStrategy needs torch_xla and an XLA device
    """

    def __init__(
        self,
        device: torch.device | str | int,
        accelerator: Accelerator | None = None,
        checkpoint_io: XLACheckpointIO | None = None,
        precision: XLAPrecision | None = None,
    ) -> None:
        """Lightning's signature; building one raises (``__new__``)."""


__all__ = ["SingleDeviceXLAStrategy"]
