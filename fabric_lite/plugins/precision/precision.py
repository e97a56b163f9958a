"""The precision interface: hooks, each a no-op by default, that a precision overrides where it differs from full
precision; the wrappers check once which are overridden, so a hook left alone costs nothing per step."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any, Literal, Union

import torch
from torch import Tensor
from torch.nn import Module, Parameter
from torch.optim import Optimizer

from fabric_lite.plugins.precision.utils import _cast_floating, _convert_module, _DtypeContextManager

# Lightning Fabric's private type names for precision arguments (clients annotate with them)
_PRECISION_INPUT_INT = Literal[64, 32, 16]
_PRECISION_INPUT_STR_ALIAS = Literal["64", "32", "16", "bf16"]
_PRECISION_INPUT_STR = Literal[
    "transformer-engine",
    "transformer-engine-float16",
    "16-true",
    "16-mixed",
    "bf16-true",
    "bf16-mixed",
    "32-true",
    "64-true",
]
_PRECISION_INPUT = Union[_PRECISION_INPUT_INT, _PRECISION_INPUT_STR, _PRECISION_INPUT_STR_ALIAS]  # noqa: UP007


class Precision:
    """Full precision (``"32-true"``) and the base class of every precision plugin: override the hooks that differ
    and pass an instance through ``Fabric(plugins=[...])``.

    Example::

        class LossPrinter(Precision):
            def post_backward(self, tensor, module):
                print(f"loss {tensor.item():.4f}")  # after every fabric.backward(loss)
    """

    #: the name of this precision, as accepted by ``Fabric(precision=...)``
    precision: str = "32-true"
    #: > 0 while ``fabric.backward`` runs (inside :meth:`backward_context`)
    _in_fabric_backward: int = 0
    #: set per class: the backward hooks and ``optimizer_step`` are the no-op defaults, so the strategy may call
    #: ``tensor.backward()`` and ``optimizer.step()`` directly (decided once per class, not on every step)
    _plain_backward: bool = True
    _plain_optimizer_step: bool = True

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls._plain_backward = all(
            getattr(cls, hook) is getattr(Precision, hook)
            for hook in ("pre_backward", "backward", "post_backward", "requires_fabric_backward")
        )
        cls._plain_optimizer_step = cls.optimizer_step is Precision.optimizer_step

    def convert_module(self, module: Module) -> Module:
        """Convert the module's parameters and buffers when it is set up (e.g. to float64). Identity here."""
        return module

    def tensor_init_context(self) -> AbstractContextManager[Any]:
        """A context under which new tensors get this precision's dtype."""
        return nullcontext()

    def module_init_context(self) -> AbstractContextManager[Any]:
        """A context under which a new module's parameters get this precision's dtype."""
        return nullcontext()

    def forward_context(self) -> AbstractContextManager[Any]:
        """A context around the module's forward (e.g. autocast). Also what ``fabric.autocast()`` returns."""
        return nullcontext()

    @contextmanager
    def backward_context(self) -> Iterator[None]:
        """The context in which the strategy runs the backward hooks for ``fabric.backward(loss)``."""
        self._in_fabric_backward += 1
        try:
            yield
        finally:
            self._in_fabric_backward -= 1

    def convert_input(self, data: Any) -> Any:
        """Convert the forward's inputs (e.g. floating tensors to float64)."""
        return data

    def convert_output(self, data: Any) -> Any:
        """Convert the forward's outputs back (e.g. to the default dtype)."""
        return data

    def pre_backward(self, tensor: Tensor, module: Module | None) -> Any:
        """Runs before ``backward`` (e.g. nothing, or loss scaling bookkeeping)."""

    def backward(self, tensor: Tensor, model: Module | None, *args: Any, **kwargs: Any) -> None:
        """Compute gradients of ``tensor``. A precision with a loss scaler scales ``tensor`` first."""
        tensor.backward(*args, **kwargs)  # type: ignore[no-untyped-call]

    def post_backward(self, tensor: Tensor, module: Module | None) -> Any:
        """Runs after ``backward``."""

    def optimizer_step(self, optimizer: Optimizer, **kwargs: Any) -> Any:
        """Step the optimizer (a precision with a loss scaler steps through it)."""
        return optimizer.step(**kwargs)

    def main_params(self, optimizer: Optimizer) -> Iterator[Parameter]:
        """The parameters the optimizer updates, for gradient clipping."""
        for group in optimizer.param_groups:
            yield from group["params"]

    def unscale_gradients(self, optimizer: Optimizer) -> None:
        """Undo loss scaling on the gradients before they are inspected or clipped."""

    def state_dict(self) -> dict[str, Any]:
        """State to save in checkpoints (e.g. the loss scaler's). Empty here."""
        return {}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore the state returned by :meth:`state_dict`."""

    def teardown(self) -> None:
        """Release what the precision holds."""

    def requires_fabric_backward(self) -> bool:
        """Whether ``fabric.backward(loss)`` is required (a loss scaler); the wrapper refuses ``loss.backward()``."""
        return False

    def skips_nonfinite_steps(self) -> bool:
        """Whether inf/NaN gradients are expected and the step skipped (a loss scaler), so clipping does not raise."""
        return False

    def changes_forward(self) -> bool:
        """Whether any forward hook is overridden; when not, the module wrapper calls the module directly."""
        return any(
            getattr(type(self), hook) is not getattr(Precision, hook)
            for hook in ("forward_context", "convert_input", "convert_output")
        )

    def __repr__(self) -> str:
        return f"{type(self).__name__}(precision={self.precision!r})"


class _TrueDtypePrecision(Precision):
    """Everything floating in ``_desired_input_dtype`` (see :class:`HalfPrecision`); outputs in the default dtype."""

    #: the dtype (Lightning's attribute name)
    _desired_input_dtype: torch.dtype = torch.float32

    def convert_module(self, module: Module) -> Module:
        return _convert_module(module, self._desired_input_dtype)

    def tensor_init_context(self) -> AbstractContextManager[Any]:
        return _DtypeContextManager(self._desired_input_dtype)

    def module_init_context(self) -> AbstractContextManager[Any]:
        return _DtypeContextManager(self._desired_input_dtype)

    def forward_context(self) -> AbstractContextManager[Any]:
        return _DtypeContextManager(self._desired_input_dtype)

    def convert_input(self, data: Any) -> Any:
        return _cast_floating(data, self._desired_input_dtype)

    def convert_output(self, data: Any) -> Any:
        return _cast_floating(data, torch.get_default_dtype())
