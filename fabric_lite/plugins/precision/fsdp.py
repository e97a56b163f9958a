"""The precision plugin named for FSDP: Lightning Fabric's ``FSDPPrecision``, on fabric_lite's precision families."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal

import torch

from fabric_lite.plugins.precision.amp import MixedPrecision
from fabric_lite.plugins.precision.half import HalfPrecision
from fabric_lite.plugins.precision.precision import Precision
from fabric_lite.utilities.rank_zero import rank_zero_warn

if TYPE_CHECKING:
    from torch.distributed.fsdp import MixedPrecision as FSDP1MixedPrecision
    from torch.distributed.fsdp import MixedPrecisionPolicy
    from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

#: the precisions FSDPPrecision runs (``FSDPStrategy`` runs no other)
FSDP_PRECISIONS = ("32-true", "16-true", "bf16-true", "16-mixed", "bf16-mixed")


#: the hooks FSDPPrecision hands to the precision family that does the work (``_impl``): every public method of
#: Precision but ``backward_context``, which counts this plugin's own running ``fabric.backward`` calls
_FAMILY_HOOKS = [
    name
    for name, value in vars(Precision).items()
    if callable(value) and not name.startswith("_") and name != "backward_context"
]


def _delegated(hook: str) -> Callable[..., Any]:
    """``Precision.<hook>`` (its signature) as a call of the same hook of ``self._impl``; set in the class body, so
    that ``Precision.__init_subclass__`` sees the hooks overridden."""

    @functools.wraps(getattr(Precision, hook), assigned=("__name__",))
    def delegate(self: FSDPPrecision, *args: Any, **kwargs: Any) -> Any:
        return getattr(self._impl, hook)(*args, **kwargs)

    delegate.__qualname__ = f"FSDPPrecision.{hook}"
    return delegate


class FSDPPrecision(Precision):
    """The precision of an ``FSDPStrategy`` run, by name: ``Fabric(strategy="fsdp", plugins=[FSDPPrecision(p)])``
    behaves as ``Fabric(strategy="fsdp", precision=p)``.

    ``"bf16-mixed"``/``"16-mixed"`` keep float32 shards, compute under autocast and all-gather and reduce gradients
    in the half type, as Lightning's does (see :attr:`mixed_precision_config`); ``"16-mixed"`` steps through a
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
        fabric.strategy.mixed_precision  # MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=bfloat16)
    """

    def __init__(
        self,
        precision: Literal["32-true", "16-true", "bf16-true", "16-mixed", "bf16-mixed"],
        scaler: ShardedGradScaler | None = None,
    ) -> None:
        if precision not in FSDP_PRECISIONS:
            raise ValueError(
                f"FSDPPrecision(precision={precision!r}) is not supported in FSDP. `precision` must be one of"
                f" {FSDP_PRECISIONS}."
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
        """The loss scaler (a ``ShardedGradScaler``) with ``"16-mixed"``, settable as in Lightning; ``None`` otherwise.

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
    def mixed_precision_config(self) -> FSDP1MixedPrecision:
        """The dtypes of :attr:`precision` as FSDP1's ``MixedPrecision``, as Lightning's plugin gives them: the half
        type throughout for ``"16-*"``/``"bf16-*"``, float32 for ``"32-true"``.

        ``FSDPStrategy`` applies ``param_dtype`` and ``reduce_dtype`` through FSDP2's ``MixedPrecisionPolicy``
        (:func:`mixed_precision_policy`); FSDP2 has no ``buffer_dtype``, so buffers keep theirs. Reading it with
        ``"16-true"``/``"bf16-true"`` warns, as Lightning's does.

        Example::

            FSDPPrecision("bf16-mixed").mixed_precision_config.reduce_dtype  # torch.bfloat16
        """
        from torch.distributed.fsdp import MixedPrecision as FSDP1MixedPrecision

        dtype = _dtype_of(self.precision)
        if dtype is not torch.float32 and self.precision.endswith("-true"):
            rank_zero_warn(
                f"FSDP with `{self.precision}` enables computation in lower precision: the module is converted to"
                f" {dtype} before it is sharded, so parameters, gradients and optimizer state are {dtype} (no float32"
                " copy is kept). Use '16-mixed' or 'bf16-mixed' to keep float32 parameters."
            )
        return FSDP1MixedPrecision(param_dtype=dtype, reduce_dtype=dtype, buffer_dtype=dtype)

    # every hook is the matching fabric_lite precision family's
    for _hook in _FAMILY_HOOKS:
        locals()[_hook] = _delegated(_hook)
    del _hook


def _dtype_of(precision: str) -> torch.dtype:
    """The floating-point type a precision name computes in: the half type of ``"16-*"``/``"bf16-*"``, else
    float32."""
    return {"16": torch.float16, "bf16": torch.bfloat16}.get(precision.partition("-")[0], torch.float32)


def mixed_precision_policy(precision: str) -> MixedPrecisionPolicy:
    """The ``MixedPrecisionPolicy`` that matches ``Fabric(precision=...)``: the dtypes of
    :attr:`FSDPPrecision.mixed_precision_config` (Lightning's), on FSDP2.

    * ``"bf16-mixed"`` / ``"16-mixed"``: the sharded parameters (and the optimizer) stay float32; each unit is
      all-gathered in bfloat16/float16 and computes in it (under autocast); gradients are reduce-scattered in it and
      accumulated into the float32 shards' gradients.
    * ``"bf16-true"`` / ``"16-true"``: everything in bfloat16/float16.
    * anything else (``"32-true"``, ``"64-true"``): no casting.

    Pass ``FSDPStrategy(mixed_precision=MixedPrecisionPolicy(param_dtype=torch.bfloat16,
    reduce_dtype=torch.float32))`` to reduce gradients in float32 instead.

    Example::

        mixed_precision_policy("bf16-mixed")
        # MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.bfloat16, ...)
    """
    from torch.distributed.fsdp import MixedPrecisionPolicy

    dtype = _dtype_of(precision)
    if dtype is torch.float32:
        return MixedPrecisionPolicy()
    return MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=dtype)
