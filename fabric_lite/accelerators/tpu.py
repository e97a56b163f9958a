"""Lightning Fabric's former name of :class:`~fabric_lite.accelerators.xla.XLAAccelerator`, at its former path."""

from __future__ import annotations

from typing import Any

from fabric_lite.accelerators.xla import XLAAccelerator
from fabric_lite.utilities.rank_zero import rank_zero_deprecation


class TPUAccelerator(XLAAccelerator):
    """Deprecated (Lightning renamed it ``XLAAccelerator``), and never available either: building one warns, then
    raises the XLA classes' error.

    Example::

        TPUAccelerator()  # LightningDeprecationWarning, then ModuleNotFoundError: ... needs torch_xla ...
    """

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        rank_zero_deprecation("The `TPUAccelerator` class is deprecated. Lightning renamed it `XLAAccelerator`.")
        return super().__new__(cls, *args, **kwargs)


__all__ = ["TPUAccelerator"]
