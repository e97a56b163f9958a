"""Lightning Fabric's ``XLACheckpointIO``: importable, an error when built (see
:mod:`fabric_lite.accelerators.xla`)."""

from __future__ import annotations

from typing import Any

from fabric_lite.accelerators.xla import _XLA_AVAILABLE as _XLA_AVAILABLE  # Lightning's name here (tests patch it)
from fabric_lite.accelerators.xla import _NeedsXLA
from fabric_lite.plugins.io.torch_io import TorchCheckpointIO


class XLACheckpointIO(_NeedsXLA, TorchCheckpointIO):
    """Checkpoints of XLA tensors, which fabric_lite does not make.

    Example::

        XLACheckpointIO()  # ModuleNotFoundError: XLACheckpointIO needs torch_xla and an XLA device ...
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        """Lightning's signature; building one raises (``__new__``)."""


__all__ = ["XLACheckpointIO"]
