"""Lightning Fabric's former name of :class:`~fabric_lite.accelerators.xla.XLAAccelerator`, at its former path."""

from __future__ import annotations

from fabric_lite.accelerators.xla import XLAAccelerator


class TPUAccelerator(XLAAccelerator):
    """Deprecated (Lightning renamed it ``XLAAccelerator``): building one warns, then raises as every XLA class does.

    Example::

        TPUAccelerator()  # LightningDeprecationWarning, then ModuleNotFoundError: ... needs torch_xla ...
    """

    _deprecated = "The `TPUAccelerator` class is deprecated. Lightning renamed it `XLAAccelerator`."


__all__ = ["TPUAccelerator"]
