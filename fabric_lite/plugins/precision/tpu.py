"""Lightning's former name of :class:`~fabric_lite.plugins.precision.xla.XLAPrecision` (32-bit), at its path."""

from __future__ import annotations

from typing import Any

from fabric_lite.plugins.precision.xla import XLAPrecision


class TPUPrecision(XLAPrecision):
    """Deprecated (Lightning's ``XLAPrecision("32-true")``): building one warns, then raises as every XLA class does.

    Example::

        TPUPrecision()  # LightningDeprecationWarning, then ModuleNotFoundError: ... needs torch_xla ...
    """

    _deprecated = "The `TPUPrecision` class is deprecated. Lightning replaced it by `XLAPrecision`."

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        """Any arguments, as in Lightning; building one raises (``__new__``)."""


__all__ = ["TPUPrecision"]
