"""Double precision: ``"64-true"``."""

from __future__ import annotations

import torch

from fabric_lite.plugins.precision.precision import _TrueDtypePrecision


class DoublePrecision(_TrueDtypePrecision):
    """Everything in float64 (``"64-true"``), as :class:`HalfPrecision` in its half type; floating outputs come back in
    the default dtype.

    Example::

        fabric = Fabric(plugins=[DoublePrecision()])  # the same as precision="64-true"
    """

    precision = "64-true"
    _desired_input_dtype = torch.float64
