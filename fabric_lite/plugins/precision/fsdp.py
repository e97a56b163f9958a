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

    ``"bf16-mixed"``/``"16-mixed"`` keep float32 shards, compute under autocast and all-gather and reduce in the half
    type (:func:`mixed_precision_policy`); ``"16-mixed"`` steps through ``scaler``, a ``ShardedGradScaler`` (default:
    a new one), so every rank skips the same steps. ``"bf16-true"``/``"16-true"`` do everything in the half type.

    Raises:
        ValueError: another ``precision``, or a ``scaler`` with a precision that does not scale the loss.

    Example::

        fabric = Fabric(strategy="fsdp", devices=2, plugins=[FSDPPrecision("bf16-mixed")])
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
        """Autocast (and a new scaler) on ``device_type``; ``FSDPStrategy`` calls it once its device is known."""
        if device_type != self._device_type:
            self._device_type = device_type
            self._impl = self._make_impl()

    @property
    def scaler(self) -> torch.amp.GradScaler | None:
        """The ``ShardedGradScaler`` of ``"16-mixed"`` (settable, as in Lightning), else ``None``; setting one with
        another precision raises ``ValueError``."""
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
        """The dtypes of :attr:`precision` as FSDP1's ``MixedPrecision``, as Lightning gives them (the half type
        throughout, or float32); ``FSDPStrategy`` applies them through FSDP2 (:func:`mixed_precision_policy`), which
        has no ``buffer_dtype``. Reading it with ``"16-true"``/``"bf16-true"`` warns, as Lightning's does."""
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
    """The dtype a precision name computes in: the half type of ``"16-*"``/``"bf16-*"``, else float32."""
    return {"16": torch.float16, "bf16": torch.bfloat16}.get(precision.partition("-")[0], torch.float32)


def mixed_precision_policy(precision: str) -> MixedPrecisionPolicy:
    """FSDP2's ``MixedPrecisionPolicy`` with the dtypes of :attr:`FSDPPrecision.mixed_precision_config`: for
    ``"bf16-mixed"``/``"16-mixed"`` the shards (and optimizer) stay float32 while each unit is all-gathered, computes
    and reduce-scatters in the half type. To reduce in float32, pass ``FSDPStrategy(mixed_precision=...)`` a policy.

    Example::

        mixed_precision_policy("bf16-mixed")  # MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=...)
    """
    from torch.distributed.fsdp import MixedPrecisionPolicy

    dtype = _dtype_of(precision)
    if dtype is torch.float32:
        return MixedPrecisionPolicy()
    return MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=dtype)
