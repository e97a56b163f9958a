"""Lightning Fabric's ``XLAStrategy``: importable, an error when built (see :mod:`fabric_lite.accelerators.xla`)."""

from __future__ import annotations

import torch

from fabric_lite.accelerators.accelerator import Accelerator
from fabric_lite.accelerators.xla import _XLA_AVAILABLE as _XLA_AVAILABLE  # Lightning's name here (tests patch it)
from fabric_lite.accelerators.xla import _NeedsXLA
from fabric_lite.plugins.io.xla import XLACheckpointIO
from fabric_lite.plugins.precision.xla import XLAPrecision
from fabric_lite.strategies.parallel import ParallelStrategy


class XLAStrategy(_NeedsXLA, ParallelStrategy):
    """Data parallel training on XLA devices (TPUs), which fabric_lite does not run on.

    Example::

        XLAStrategy()  # ModuleNotFoundError: XLAStrategy needs torch_xla and an XLA device ...
    """

    requires_joint_setup = True  # as Lightning's: its optimizers are set up with the module

    def __init__(
        self,
        accelerator: Accelerator | None = None,
        parallel_devices: list[torch.device] | None = None,
        checkpoint_io: XLACheckpointIO | None = None,
        precision: XLAPrecision | None = None,
        sync_module_states: bool = True,
    ) -> None:
        """Lightning's signature; building one raises (``__new__``)."""


__all__ = ["XLAStrategy"]
