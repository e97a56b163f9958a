"""DeepSpeed's precision: the engine casts the model and runs backward and step; the plugin casts inputs and outputs."""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from typing import Any, Literal

import torch
from torch import Tensor
from torch.nn import Module
from torch.optim import Optimizer

from fabric_lite.plugins.precision.precision import Precision
from fabric_lite.plugins.precision.utils import _cast_floating, _convert_module, _DtypeContextManager

#: the precisions DeepSpeed runs, as ``Fabric(precision=...)`` names them (Lightning's DeepSpeedPrecision accepts the
#: same five); ``"16-mixed"``/``"16-true"`` need a device with float16 support (not DeepSpeed's CPU accelerator)
DEEPSPEED_PRECISIONS = ("32-true", "16-true", "bf16-true", "16-mixed", "bf16-mixed")
_DTYPES = {
    "32-true": torch.float32,
    "16-true": torch.float16,
    "bf16-true": torch.bfloat16,
    "16-mixed": torch.float16,
    "bf16-mixed": torch.bfloat16,
}


class DeepSpeedPrecision(Precision):
    """The precision plugin :class:`~fabric_lite.strategies.DeepSpeedStrategy` builds from ``Fabric(precision=...)``.

    DeepSpeed's engine does the precision work from its config: it casts the model, keeps float32 master weights and
    scales a float16 loss in its ``backward``. This plugin casts floating inputs to the dtype and outputs back, and
    with ``"-true"`` creates and converts the module in it.

    Args:
        precision: ``"32-true"``, ``"bf16-mixed"``, ``"bf16-true"``, ``"16-mixed"`` or ``"16-true"``; another raises
            ``ValueError``.

    Example::

        fabric = Fabric(strategy="deepspeed", plugins=[DeepSpeedPrecision("bf16-mixed")])
    """

    def __init__(self, precision: Literal["32-true", "16-true", "bf16-true", "16-mixed", "bf16-mixed"]) -> None:
        if precision not in DEEPSPEED_PRECISIONS:
            raise ValueError(
                f"`precision={precision!r}` is not supported in DeepSpeed. `precision` must be one of:"
                f" {DEEPSPEED_PRECISIONS}."
            )
        self.precision = precision
        self._desired_dtype = _DTYPES[precision]

    def convert_module(self, module: Module) -> Module:
        """With ``"-true"`` the floating parameters and buffers in the half type, else unchanged (the engine casts)."""
        return _convert_module(module, self._desired_dtype) if self.precision.endswith("-true") else module

    def tensor_init_context(self) -> AbstractContextManager[Any]:
        """With ``"-true"``, new floating tensors get the half type."""
        return _DtypeContextManager(self._desired_dtype) if self.precision.endswith("-true") else nullcontext()

    def module_init_context(self) -> AbstractContextManager[Any]:
        """With ``"-true"``, a new module's parameters get the half type."""
        return self.tensor_init_context()

    def convert_input(self, data: Any) -> Any:
        """Floating tensors cast to the dtype the engine computes in."""
        return _cast_floating(data, self._desired_dtype)

    def convert_output(self, data: Any) -> Any:
        """Floating tensors cast back to the default dtype."""
        return _cast_floating(data, torch.get_default_dtype())

    def backward(self, tensor: Tensor, model: Module | None, *args: Any, **kwargs: Any) -> None:
        """``model.backward(tensor)``: the engine scales the loss and reduces gradients; ``TypeError`` without one."""
        engine_backward = getattr(model, "backward", None)
        if not callable(engine_backward):
            raise TypeError(
                f"DeepSpeedPrecision.backward needs the DeepSpeed engine, got {type(model).__name__}: call"
                " fabric.backward(loss) (with model=... when several models were set up)."
            )
        engine_backward(tensor, *args, **kwargs)

    def optimizer_step(self, optimizer: Optimizer, **kwargs: Any) -> Any:
        """``optimizer.step()``: the engine steps (and zeroes the gradients) at its accumulation boundary."""
        return optimizer.step(**kwargs)
