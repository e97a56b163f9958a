"""Mixed precision: ``"16-mixed"`` and ``"bf16-mixed"`` with ``torch.autocast`` (and a loss scaler for float16)."""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any, Literal

import torch
from torch import Tensor
from torch.nn import Module
from torch.optim import LBFGS, Optimizer
from typing_extensions import override

from fabric_lite.plugins.precision.precision import Precision
from fabric_lite.plugins.precision.utils import _cast_floating

_MIXED = ("16-mixed", "bf16-mixed")


class MixedPrecision(Precision):
    """Automatic mixed precision: the forward runs under ``torch.autocast`` in float16 or bfloat16.

    Parameters stay float32; floating inputs are cast to the half type and outputs come back in the default dtype.
    With ``"16-mixed"`` a ``torch.amp.GradScaler`` scales the loss in ``fabric.backward``, unscales the gradients once
    before clipping and steps the optimizer, skipping a step whose gradients hold inf/NaN; its state is checkpointed.

    Args:
        precision: ``"16-mixed"`` or ``"bf16-mixed"``.
        device: the device type for autocast and the scaler: ``"cuda"``, ``"cpu"`` or ``"mps"``.
        scaler: the ``GradScaler`` for ``"16-mixed"`` (default: a new one); ``ValueError`` with ``"bf16-mixed"``.

    Example::

        Fabric(plugins=[MixedPrecision("16-mixed", "cpu")])  # float16 on the CPU, with a scaler
    """

    def __init__(
        self,
        precision: Literal["16-mixed", "bf16-mixed"],
        device: str,
        scaler: torch.amp.GradScaler | None = None,
    ) -> None:
        if precision not in _MIXED:
            raise ValueError(
                f"Passed `{type(self).__name__}(precision={precision!r})`. Precision must be '16-mixed' or"
                " 'bf16-mixed' (for the legacy 16 and 'bf16', pass '16-mixed' and 'bf16-mixed')."
            )
        if scaler is not None and precision == "bf16-mixed":
            raise ValueError(
                f"`precision='bf16-mixed'` does not use a scaler, found scaler={scaler!r}. Leave scaler out, or use"
                " precision='16-mixed' to scale the loss."
            )
        if scaler is None and precision == "16-mixed":
            scaler = torch.amp.GradScaler(device=device)
        self.precision = precision
        self.device = device
        self.scaler = scaler
        self._desired_input_dtype = torch.bfloat16 if precision == "bf16-mixed" else torch.float16
        # optimizers whose gradients were unscaled since their last step (clip_gradients may be called twice)
        self._unscaled: set[int] = set()

    @override
    def forward_context(self) -> AbstractContextManager[Any]:
        return torch.autocast(self.device, dtype=self._desired_input_dtype)

    @override
    def convert_input(self, data: Any) -> Any:
        return _cast_floating(data, self._desired_input_dtype)

    @override
    def convert_output(self, data: Any) -> Any:
        return _cast_floating(data, torch.get_default_dtype())

    @override
    def requires_fabric_backward(self) -> bool:
        return self.scaler is not None

    @override
    def skips_nonfinite_steps(self) -> bool:
        return self.scaler is not None

    @override
    def backward(self, tensor: Tensor, model: Module | None, *args: Any, **kwargs: Any) -> None:
        if self.scaler is not None:
            tensor = self.scaler.scale(tensor)
        super().backward(tensor, model, *args, **kwargs)

    @override
    def optimizer_step(self, optimizer: Optimizer, **kwargs: Any) -> Any:
        if self.scaler is None:
            return super().optimizer_step(optimizer, **kwargs)
        if isinstance(optimizer, LBFGS):
            raise TypeError(
                "precision='16-mixed' steps through a GradScaler, which cannot drive LBFGS (it needs a closure)."
                " Use precision='bf16-mixed' or '32-true' with LBFGS."
            )
        # the scaler skips optimizer.step() when the gradients hold inf/NaN, and lowers the scale
        output = self.scaler.step(optimizer, **kwargs)
        self.scaler.update()
        self._unscaled.discard(id(optimizer))
        return output

    @override
    def unscale_gradients(self, optimizer: Optimizer) -> None:
        if self.scaler is None or id(optimizer) in self._unscaled:
            return
        if getattr(optimizer, "_step_supports_amp_scaling", False):
            raise NotImplementedError(
                f"{type(optimizer).__name__} unscales its gradients inside step(), so they cannot be clipped before"
                " it. Clip without fabric.clip_gradients, or use an optimizer without fused AMP support."
            )
        self.scaler.unscale_(optimizer)
        self._unscaled.add(id(optimizer))

    @override
    def state_dict(self) -> dict[str, Any]:
        return self.scaler.state_dict() if self.scaler is not None else {}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if self.scaler is not None and state_dict:
            self.scaler.load_state_dict(state_dict)

    def __repr__(self) -> str:
        return f"MixedPrecision(precision={self.precision!r}, device={self.device!r}, scaler={self.scaler is not None})"
