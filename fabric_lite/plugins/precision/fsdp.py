"""The precision plugin named for FSDP: Lightning Fabric's ``FSDPPrecision``, on fabric_lite's precision families."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, Literal

import torch
from torch import Tensor
from torch.nn import Module, Parameter
from torch.optim import Optimizer
from typing_extensions import override

from fabric_lite.plugins.precision.amp import MixedPrecision
from fabric_lite.plugins.precision.half import HalfPrecision
from fabric_lite.plugins.precision.precision import Precision

if TYPE_CHECKING:
    from torch.distributed.fsdp import MixedPrecisionPolicy
    from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

_FSDP_PRECISIONS = ("32-true", "16-true", "bf16-true", "16-mixed", "bf16-mixed")


class FSDPPrecision(Precision):
    """The precision of an ``FSDPStrategy`` run, by name: ``Fabric(strategy="fsdp", plugins=[FSDPPrecision(p)])``
    behaves as ``Fabric(strategy="fsdp", precision=p)``.

    ``"bf16-mixed"``/``"16-mixed"`` keep float32 shards, compute under autocast and all-gather in the half type,
    with gradients reduced in float32 (see :attr:`mixed_precision_config`); ``"16-mixed"`` steps through a
    ``ShardedGradScaler``, so every rank skips the same steps. ``"bf16-true"``/``"16-true"`` do everything in the
    half type; ``"32-true"`` changes nothing. The autocast device follows the strategy's device.

    Args:
        precision: one of ``"32-true"``, ``"16-true"``, ``"bf16-true"``, ``"16-mixed"``, ``"bf16-mixed"``.
        scaler: a ``torch.distributed.fsdp.sharded_grad_scaler.ShardedGradScaler`` for ``"16-mixed"`` (one is
            created when not given); other precisions take none.

    Raises:
        ValueError: another ``precision``, or a ``scaler`` with a precision that does not scale the loss.

    Example::

        fabric = Fabric(strategy="fsdp", devices=2, plugins=[FSDPPrecision("bf16-mixed")])
        fabric.strategy.mixed_precision  # MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=float32)
    """

    def __init__(
        self,
        precision: Literal["32-true", "16-true", "bf16-true", "16-mixed", "bf16-mixed"],
        scaler: ShardedGradScaler | None = None,
    ) -> None:
        if precision not in _FSDP_PRECISIONS:
            raise ValueError(
                f"FSDPPrecision(precision={precision!r}) is not supported in FSDP. `precision` must be one of"
                f" {_FSDP_PRECISIONS}."
            )
        if scaler is not None and precision != "16-mixed":
            raise ValueError(
                f"FSDPPrecision(`precision={precision!r}` does not use a scaler, found scaler={scaler!r}): only"
                " '16-mixed' scales the loss. Pass scaler=None."
            )
        self.precision = precision
        self._given_scaler: torch.amp.GradScaler | None = scaler
        self._device_type = "cuda" if torch.cuda.is_available() else "cpu"
        self._impl = self._make_impl()

    def _make_impl(self) -> Precision:
        if self.precision in ("16-mixed", "bf16-mixed"):
            scaler = self._given_scaler
            if scaler is None and self.precision == "16-mixed":
                from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

                scaler = ShardedGradScaler(device=self._device_type)
            return MixedPrecision(self.precision, device=self._device_type, scaler=scaler)  # type: ignore[arg-type]
        if self.precision in ("16-true", "bf16-true"):
            return HalfPrecision(self.precision)  # type: ignore[arg-type]
        return Precision()

    def _set_device_type(self, device_type: str) -> None:
        """Autocast (and a created scaler) on ``device_type``; called by ``FSDPStrategy`` once its device is known,
        before any step."""
        if device_type != self._device_type:
            self._device_type = device_type
            self._impl = self._make_impl()

    @property
    def scaler(self) -> torch.amp.GradScaler | None:
        """The loss scaler (a ``ShardedGradScaler``) with ``"16-mixed"``; ``None`` otherwise. Settable with
        ``"16-mixed"`` (Lightning's plugin has it as a plain attribute), e.g. to a scaler with other settings.

        Raises:
            ValueError: setting one with another precision, which scales nothing.
        """
        return getattr(self._impl, "scaler", None)

    @scaler.setter
    def scaler(self, scaler: torch.amp.GradScaler | None) -> None:
        if self.precision != "16-mixed":
            if scaler is None:
                return
            raise ValueError(
                f"FSDPPrecision(`precision={self.precision!r}` does not use a scaler, found scaler={scaler!r}): only"
                " '16-mixed' scales the loss."
            )
        self._given_scaler = scaler
        self._impl.scaler = scaler  # type: ignore[attr-defined]

    @property
    def mixed_precision_config(self) -> MixedPrecisionPolicy:
        """The ``torch.distributed.fsdp.MixedPrecisionPolicy`` (FSDP2) that matches :attr:`precision`.

        Example::

            FSDPPrecision("bf16-mixed").mixed_precision_config.param_dtype  # torch.bfloat16
        """
        return mixed_precision_policy(self.precision)

    # every hook is the matching fabric_lite precision family's
    @override
    def convert_module(self, module: Module) -> Module:
        return self._impl.convert_module(module)

    @override
    def tensor_init_context(self) -> AbstractContextManager[Any]:
        return self._impl.tensor_init_context()

    @override
    def module_init_context(self) -> AbstractContextManager[Any]:
        return self._impl.module_init_context()

    @override
    def forward_context(self) -> AbstractContextManager[Any]:
        return self._impl.forward_context()

    @override
    def convert_input(self, data: Any) -> Any:
        return self._impl.convert_input(data)

    @override
    def convert_output(self, data: Any) -> Any:
        return self._impl.convert_output(data)

    @override
    def pre_backward(self, tensor: Tensor, module: Module | None) -> Any:
        return self._impl.pre_backward(tensor, module)

    @override
    def backward(self, tensor: Tensor, model: Module | None, *args: Any, **kwargs: Any) -> None:
        self._impl.backward(tensor, model, *args, **kwargs)

    @override
    def post_backward(self, tensor: Tensor, module: Module | None) -> Any:
        return self._impl.post_backward(tensor, module)

    @override
    def optimizer_step(self, optimizer: Optimizer, **kwargs: Any) -> Any:
        return self._impl.optimizer_step(optimizer, **kwargs)

    @override
    def main_params(self, optimizer: Optimizer) -> Iterator[Parameter]:
        return self._impl.main_params(optimizer)

    @override
    def unscale_gradients(self, optimizer: Optimizer) -> None:
        self._impl.unscale_gradients(optimizer)

    @override
    def state_dict(self) -> dict[str, Any]:
        return self._impl.state_dict()

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._impl.load_state_dict(state_dict)

    @override
    def teardown(self) -> None:
        self._impl.teardown()

    @override
    def requires_fabric_backward(self) -> bool:
        return self._impl.requires_fabric_backward()

    @override
    def skips_nonfinite_steps(self) -> bool:
        return self._impl.skips_nonfinite_steps()

    @override
    def changes_forward(self) -> bool:
        return self._impl.changes_forward()


def mixed_precision_policy(precision: str) -> MixedPrecisionPolicy:
    """The ``MixedPrecisionPolicy`` that matches ``Fabric(precision=...)``.

    * ``"bf16-mixed"`` / ``"16-mixed"``: the sharded parameters (and the optimizer) stay float32; each unit is
      all-gathered in bfloat16/float16 and computes in it; gradients are reduce-scattered in float32.
    * ``"bf16-true"`` / ``"16-true"``: everything in bfloat16/float16, gradients reduced in it too.
    * anything else (``"32-true"``, ``"64-true"``): no casting.

    Example::

        mixed_precision_policy("bf16-mixed")
        # MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32, ...)
    """
    from torch.distributed.fsdp import MixedPrecisionPolicy

    half = {"bf16": torch.bfloat16, "16": torch.float16}
    kind, _, mode = precision.partition("-")
    if kind in half and mode == "mixed":
        return MixedPrecisionPolicy(param_dtype=half[kind], reduce_dtype=torch.float32)
    if kind in half and mode == "true":
        return MixedPrecisionPolicy(param_dtype=half[kind], reduce_dtype=half[kind])
    return MixedPrecisionPolicy()
