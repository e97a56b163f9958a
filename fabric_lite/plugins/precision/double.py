"""Double precision: ``"64-true"``."""

from __future__ import annotations

import torch

from fabric_lite.plugins.precision.precision import _TrueDtypePrecision


class DoublePrecision(_TrueDtypePrecision):
    """Train in ``float64``: parameters, buffers and floating inputs become float64, new tensors created under
    ``fabric.init_module()``/``init_tensor()`` and inside the forward default to float64, and floating outputs
    come back in the default dtype (float32), as in Lightning Fabric. Complex and integer parameters and buffers
    keep their dtype (a complex128 buffer stays complex128).

    Example::

        fabric = Fabric(plugins=[DoublePrecision()])  # the same as precision="64-true"
        model = fabric.setup(torch.nn.Linear(2, 1))
        model.weight.dtype  # torch.float64
        model(torch.ones(2)).dtype  # torch.float32
    """

    precision = "64-true"
    _desired_input_dtype = torch.float64
