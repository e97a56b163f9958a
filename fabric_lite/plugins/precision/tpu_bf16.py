"""Lightning's former name of :class:`~fabric_lite.plugins.precision.xla.XLAPrecision` (bfloat16), at its path."""

from __future__ import annotations

from fabric_lite.plugins.precision.xlabf16 import XLABf16Precision


class TPUBf16Precision(XLABf16Precision):
    """Deprecated (Lightning's ``XLAPrecision("bf16-true")``): building one warns, then raises as every XLA class does.

    Example::

        TPUBf16Precision()  # LightningDeprecationWarning, then ModuleNotFoundError: ... needs torch_xla ...
    """


__all__ = ["TPUBf16Precision"]
