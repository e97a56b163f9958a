"""Lightning Fabric's ``XLAPrecision``: importable, an error when built (see :mod:`fabric_lite.accelerators.xla`)."""

from __future__ import annotations

from typing import Literal

from fabric_lite.accelerators.xla import _XLA_AVAILABLE as _XLA_AVAILABLE  # Lightning's name here (tests patch it)
from fabric_lite.accelerators.xla import _NeedsXLA
from fabric_lite.plugins.precision.precision import Precision

_PRECISION_INPUT = Literal["32-true", "16-true", "bf16-true"]


class XLAPrecision(_NeedsXLA, Precision):
    """Precision on XLA devices (TPUs), which fabric_lite does not run on.

    Example::

        XLAPrecision("bf16-true")  # ModuleNotFoundError: XLAPrecision needs torch_xla and an XLA device ...
    """

    def __init__(self, precision: _PRECISION_INPUT) -> None:
        """Lightning's signature; building one raises (``__new__``)."""


__all__ = ["XLAPrecision"]
