"""Lightning's former name of :class:`~fabric_lite.plugins.precision.xla.XLAPrecision` (bfloat16), at its path."""

from __future__ import annotations

from typing import Any

from fabric_lite.plugins.precision.xla import XLAPrecision


class XLABf16Precision(XLAPrecision):
    """Deprecated (Lightning's ``XLAPrecision("bf16-true")``): building one warns, then raises as every XLA class does.

    Example::

        XLABf16Precision()  # LightningDeprecationWarning, then ModuleNotFoundError: ... needs torch_xla ...
    """

    _deprecated = "The `{name}` class is deprecated. Lightning replaced it by `XLAPrecision`."

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        """Any arguments, as in Lightning; building one raises (``__new__``)."""


__all__ = ["XLABf16Precision"]
