"""FP8 training with NVIDIA's `Transformer Engine <https://docs.nvidia.com/deeplearning/transformer-engine>`__ on
CUDA GPUs (Hopper and newer); the optional ``transformer_engine`` is imported on first use, never at import."""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager, ExitStack, contextmanager
from typing import Any, Literal

import torch
from torch.nn import Module

from fabric_lite.plugins.precision.precision import _TrueDtypePrecision
from fabric_lite.plugins.precision.utils import _ClassReplacementContextManager, _convert_module, _DtypeContextManager
from fabric_lite.utilities.imports import _Availability
from fabric_lite.utilities.rank_zero import rank_zero_info, rank_zero_warn

#: whether transformer_engine is installed (Lightning's private name, which its tests patch)
_TRANSFORMER_ENGINE_AVAILABLE = _Availability("transformer_engine", "0.11.0")
log = logging.getLogger(__name__)


class TransformerEnginePrecision(_TrueDtypePrecision):
    """FP8 compute through Transformer Engine: its layers' matrix products in FP8 under ``te.fp8_autocast(recipe)``,
    the rest of the forward under ``torch.autocast("cuda", fallback_compute_dtype)``. ``precision="transformer-engine"``
    is this with ``weights_dtype=torch.bfloat16``, ``"transformer-engine-float16"`` with ``torch.float16``.

    Only Transformer Engine's layers compute in FP8, so ``fabric.setup`` replaces each ``torch.nn.Linear`` and
    ``LayerNorm`` by theirs (not subclasses of torch's), keeping the weights; a ``Linear`` whose ``in_features`` is not
    divisible by 8 or ``out_features`` by 16 is kept, with a warning.

    Args:
        weights_dtype: the dtype of the parameters, the inputs and tensors made under ``init_module()``.
        recipe: a ``DelayedScaling`` recipe, or a mapping of its arguments (``fp8_format`` by name, e.g.
            ``{"fp8_format": "HYBRID"}``); default ``DelayedScaling()``.
        replace_layers: replace the torch layers at ``setup`` (``None``: unless the model holds Transformer Engine
            layers already); ``True`` also makes ``fabric.init_module()`` create theirs.
        fallback_compute_dtype: the autocast dtype of what does not run in FP8; default ``weights_dtype``.

    Raises:
        ModuleNotFoundError: ``transformer_engine`` is not installed.

    Example::

        fabric = Fabric(accelerator="cuda", precision="transformer-engine")
    """

    precision: Literal["transformer-engine", "transformer-engine-float16"] = "transformer-engine"

    def __init__(
        self,
        *,
        weights_dtype: torch.dtype,
        recipe: Mapping[str, Any] | Any | None = None,
        replace_layers: bool | None = None,
        fallback_compute_dtype: torch.dtype | None = None,
    ) -> None:
        if not _TRANSFORMER_ENGINE_AVAILABLE:
            raise ModuleNotFoundError(
                f"TransformerEnginePrecision needs NVIDIA's transformer_engine ({_TRANSFORMER_ENGINE_AVAILABLE}):"
                " pip install 'transformer_engine[pytorch]' on a machine with a CUDA GPU, or use"
                " precision='bf16-mixed'."
            )
        from transformer_engine.common.recipe import DelayedScaling  # type: ignore[import-not-found,import-untyped,unused-ignore]

        if recipe is None:
            recipe = DelayedScaling()
        elif isinstance(recipe, Mapping):
            arguments = dict(recipe)  # the caller's mapping is left as given
            if "fp8_format" in arguments:
                from transformer_engine.common.recipe import Format  # type: ignore[import-not-found,import-untyped,unused-ignore]

                arguments["fp8_format"] = getattr(Format, arguments["fp8_format"])
            recipe = DelayedScaling(**arguments)
        self.weights_dtype = weights_dtype
        self.recipe = recipe
        self.replace_layers = replace_layers
        self.fallback_compute_dtype = fallback_compute_dtype or weights_dtype
        # the name Fabric(precision=...) takes for it, so that precision="transformer-engine-float16" agrees with it
        self.precision = "transformer-engine-float16" if weights_dtype == torch.float16 else "transformer-engine"

    @property
    def weights_dtype(self) -> torch.dtype:
        """The dtype of the parameters, the inputs and the tensors made under ``init_module()``/``init_tensor()``."""
        return self._desired_input_dtype

    @weights_dtype.setter
    def weights_dtype(self, dtype: torch.dtype) -> None:
        self._desired_input_dtype = dtype

    def convert_module(self, module: Module) -> Module:
        if any("transformer_engine.pytorch" in type(layer).__module__ for layer in module.modules()):
            # the user built the model with Transformer Engine layers (or under init_module): leave it as it is
            if self.replace_layers is True:
                rank_zero_info(
                    "`TransformerEnginePrecision(replace_layers=True)` is set but the model already contains"
                    " TransformerEngine layers. Skipping"
                )
        elif self.replace_layers in (None, True):
            _replace_layers(module)
        return _convert_module(module, self.weights_dtype)

    def module_init_context(self) -> AbstractContextManager[Any]:
        return self._module_init_context()

    @contextmanager
    def _module_init_context(self) -> Iterator[None]:
        with ExitStack() as stack:
            if self.replace_layers:
                import transformer_engine.pytorch as te  # type: ignore[import-not-found,import-untyped,unused-ignore]

                stack.enter_context(
                    _ClassReplacementContextManager({"torch.nn.Linear": te.Linear, "torch.nn.LayerNorm": te.LayerNorm})
                )
            stack.enter_context(_DtypeContextManager(self.weights_dtype))
            yield

    def forward_context(self) -> AbstractContextManager[Any]:
        return self._forward_context()

    @contextmanager
    def _forward_context(self) -> Iterator[None]:
        import transformer_engine.pytorch as te  # type: ignore[import-not-found,import-untyped,unused-ignore]

        with ExitStack() as stack:
            stack.enter_context(_DtypeContextManager(self.weights_dtype))
            # outside fp8_autocast: the operations Transformer Engine does not run in FP8 fall back to this dtype
            stack.enter_context(torch.autocast(device_type="cuda", dtype=self.fallback_compute_dtype))
            stack.enter_context(te.fp8_autocast(enabled=True, fp8_recipe=self.recipe))
            yield


def _replace_layers(module: Module) -> None:
    """Replace, at any depth, each ``Linear`` of a shape FP8 supports and each 1-d ``LayerNorm`` by Transformer
    Engine's, with copies of its weights."""
    import transformer_engine.pytorch as te  # type: ignore[import-not-found,import-untyped,unused-ignore]

    for name, child in module.named_children():
        if isinstance(child, torch.nn.Linear):
            if child.in_features % 8 != 0 or child.out_features % 16 != 0:
                rank_zero_warn(
                    "Support for FP8 in the linear layers with this plugin is currently limited to"
                    " tensors with shapes where the dimensions are divisible by 8 and 16 respectively."
                    f" The layer {name!r} does not fit this criteria. You might want to add padding to your inputs."
                )
                continue
            replacement = te.Linear(child.in_features, child.out_features, bias=child.bias is not None)
        elif isinstance(child, torch.nn.LayerNorm) and len(child.normalized_shape) == 1:
            replacement = te.LayerNorm(child.normalized_shape[0], eps=child.eps)
        else:
            _replace_layers(child)
            continue
        for parameter_name in ("weight", "bias"):
            source = getattr(child, parameter_name, None)
            if source is not None and getattr(replacement, parameter_name, None) is not None:
                getattr(replacement, parameter_name).data = source.data.clone()
        log.debug(f"Replacing layer {name!r} with its Transformer Engine equivalent")
        module.__setattr__(name, replacement)  # an __setattr__ set on the instance sees it, as in Lightning


__all__ = ["TransformerEnginePrecision"]
