"""Lightning Fabric's former name of :class:`~fabric_lite.plugins.precision.xla.XLAPrecision` in bfloat16 on TPUs,
at its former path."""

from __future__ import annotations

from fabric_lite.plugins.precision.xlabf16 import XLABf16Precision


class TPUBf16Precision(XLABf16Precision):
    """Deprecated (Lightning's ``XLAPrecision("bf16-true")``), and never available either: building one warns, then
    raises the XLA classes' error.

    Example::

        TPUBf16Precision()  # LightningDeprecationWarning, then ModuleNotFoundError: ... needs torch_xla ...
    """


__all__ = ["TPUBf16Precision"]
