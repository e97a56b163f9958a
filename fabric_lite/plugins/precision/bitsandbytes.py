"""8- and 4-bit weights through `bitsandbytes <https://github.com/bitsandbytes-foundation/bitsandbytes>`__."""

from __future__ import annotations

import functools
import importlib
import math
import os
import warnings
from contextlib import AbstractContextManager, ExitStack
from types import ModuleType
from typing import Any, Literal, get_args

import torch
from torch import Tensor
from torch.nn import Module

from fabric_lite.plugins.precision.precision import Precision
from fabric_lite.plugins.precision.utils import _cast_floating, _ClassReplacementContextManager, _DtypeContextManager
from fabric_lite.utilities.imports import _Availability

_Mode = Literal["nf4", "nf4-dq", "fp4", "fp4-dq", "int8", "int8-training"]
_MODES: tuple[str, ...] = get_args(_Mode)
#: whether bitsandbytes is installed (Lightning's private name, which litgpt's tests import)
_BITSANDBYTES_AVAILABLE = _Availability("bitsandbytes")


class BitsandbytesPrecision(Precision):
    """Quantise the weights of ``torch.nn.Linear`` layers to 8 or 4 bits with bitsandbytes, on the CPU or a CUDA GPU.

    ``fabric.setup`` swaps each ``Linear`` for a layer that holds the float weight until it is moved to the device;
    under ``fabric.init_module()`` layers are quantised as they are created, so the float model never exists whole.
    Quantised weights are frozen (train adapters beside them, e.g. LoRA); checkpoints keep them quantised, and a
    float checkpoint is quantised on load. The optimizer is not replaced by an 8-bit one.

    Args:
        mode: ``"nf4"``/``"fp4"`` (4-bit, QLoRA), with ``"-dq"`` also quantising the block scales, ``"int8"``
            (LLM.int8(), frozen) or ``"int8-training"`` (trainable float weights, quantised in each forward).
        dtype: the compute dtype of the inputs and the forward. The ``int8`` modes need (and default to)
            ``torch.float16``; 4-bit defaults to ``torch.bfloat16`` unless the CUDA GPU lacks it.
        ignore_modules: prefixes of submodule names whose Linear layers stay in float, e.g. ``{"lm_head"}``.

    Raises:
        ValueError: an unknown ``mode``, or an ``int8`` mode with a dtype other than ``torch.float16``.
        TypeError: ``dtype`` is not a floating ``torch.dtype``.
        ModuleNotFoundError: bitsandbytes is not installed (``pip install bitsandbytes``).

    Example::

        fabric = Fabric(accelerator="cpu", plugins=[BitsandbytesPrecision("nf4")])
        model = fabric.setup_module(model)  # every Linear is now a 4-bit layer, frozen
    """

    def __init__(
        self,
        mode: _Mode,
        dtype: torch.dtype | None = None,
        ignore_modules: set[str] | None = None,
    ) -> None:
        if mode not in _MODES:
            raise ValueError(f"BitsandbytesPrecision(mode={mode!r}): mode must be one of {_MODES}.")
        _import_bitsandbytes()
        if dtype is None:
            if mode.startswith("int8"):
                dtype = torch.float16
            elif torch.cuda.is_available():
                dtype = torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
            else:
                dtype = torch.bfloat16  # the CPU: bfloat16 matmuls are fast where float16 ones are not
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
            raise TypeError(f"BitsandbytesPrecision(dtype={dtype!r}): dtype must be a floating torch.dtype.")
        if mode.startswith("int8") and dtype is not torch.float16:
            raise ValueError(
                f"BitsandbytesPrecision(mode={mode!r}, dtype={dtype}): {mode!r} only works with"
                " `dtype=torch.float16`; pass that, or leave dtype out."
            )
        self.mode = mode
        self.dtype = dtype
        self.ignore_modules: set[str] = set(ignore_modules or ())
        self._linear_cls = _layer_classes()[mode]

    def convert_module(self, module: Module) -> Module:
        """Replace the ``Linear`` layers not in ``ignore_modules`` by this mode's layers (unless ``init_module`` made
        them), and cast the other floating tensors to the compute dtype; ``TypeError`` where there is no ``Linear``."""
        if not any(isinstance(m, torch.nn.Linear) for m in module.modules()):
            raise TypeError(
                "You are using the bitsandbytes precision plugin, but your model has no Linear layers. This plugin"
                " won't work for your model."
            )
        bnb = _import_bitsandbytes()
        quantised = (bnb.nn.Linear8bitLt, bnb.nn.Linear4bit)
        if not any(isinstance(m, quantised) for m in module.modules()):
            _convert_layers(module, self._linear_cls, self.ignore_modules)
        for m in module.modules():
            if isinstance(m, bnb.nn.Linear4bit):
                m.compute_dtype = self.dtype
                m.compute_type_is_set = False  # as in Lightning: the first input's dtype may still override it
            elif not isinstance(m, quantised):
                # the rest of the model computes in the compute dtype too, as if created under init_module (Lightning
                # leaves it as it is, so an ignored float32 Linear fails on the cast inputs)
                for tensor in [*m.parameters(recurse=False), *m.buffers(recurse=False)]:
                    if tensor.is_floating_point() and tensor.dtype != self.dtype:
                        tensor.data = tensor.data.to(self.dtype)
        return module

    def tensor_init_context(self) -> AbstractContextManager[Any]:
        """New floating tensors get the compute dtype."""
        return _DtypeContextManager(self.dtype)

    def module_init_context(self) -> AbstractContextManager[Any]:
        """Inside, ``torch.nn.Linear(...)`` creates this mode's quantised layer and parameters get the compute
        dtype. Not available with ``ignore_modules`` (which layers to leave in float is only known afterwards)."""
        if self.ignore_modules:
            raise RuntimeError(
                "Instantiating your model under the `init_module` context manager is not supported when used with"
                f" `BitsandbytesPrecision(..., ignore_modules={self.ignore_modules})` as this"
                " may initialize the layers on-device, defeating the purpose of quantization. You can remove"
                " `ignore_modules` or remove the `init_module` context manager."
            )
        stack = ExitStack()
        stack.enter_context(self.tensor_init_context())
        stack.enter_context(_ClassReplacementContextManager({"torch.nn.Linear": self._linear_cls}))
        return stack

    def forward_context(self) -> AbstractContextManager[Any]:
        """The forward runs with the compute dtype as the default dtype."""
        return _DtypeContextManager(self.dtype)

    def convert_input(self, data: Any) -> Any:
        """Floating inputs are cast to the compute dtype."""
        return _cast_floating(data, self.dtype)

    def convert_output(self, data: Any) -> Any:
        """Floating outputs come back in the default dtype."""
        return _cast_floating(data, torch.get_default_dtype())

    def __repr__(self) -> str:
        return f"{type(self).__name__}(mode={self.mode!r}, dtype={self.dtype})"


@functools.lru_cache(maxsize=1)  # a failed import is not cached: installing the package later works
def _import_bitsandbytes() -> ModuleType:
    """bitsandbytes (optional: imported when the plugin is built), without its welcome banner and CPU warnings."""
    set_by_us = "BITSANDBYTES_NOWELCOME" not in os.environ
    if set_by_us:
        os.environ["BITSANDBYTES_NOWELCOME"] = "1"
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=r".*bitsandbytes was compiled without GPU support.*")
            return importlib.import_module("bitsandbytes")
    except ModuleNotFoundError as err:
        if err.name != "bitsandbytes":
            raise
        raise ModuleNotFoundError(
            "BitsandbytesPrecision needs the `bitsandbytes` package: `pip install bitsandbytes` (or"
            " `pip install fabric-lite[bitsandbytes]`).",
            name="bitsandbytes",
        ) from err
    finally:
        if set_by_us:
            del os.environ["BITSANDBYTES_NOWELCOME"]


def _real_device(device: Any) -> torch.device:
    """Where a tensor created with ``device=device`` lands (the ambient device context when ``None``)."""
    return torch.empty(0, device=device).device


@functools.lru_cache(maxsize=1)
def _layer_classes() -> dict[str, type[Module]]:
    """The quantised Linear layer of each mode (defined here: they subclass bitsandbytes' modules)."""
    bnb: Any = _import_bitsandbytes()

    class _Linear8bitLt(bnb.nn.Linear8bitLt):  # type: ignore[misc]
        """``Linear8bitLt`` that quantises where it is created on a real device, loads float and int8 checkpoints,
        and runs ``int8-training`` in eval mode on the CPU."""

        weight: Any  # an Int8Params

        def __init__(self, *args: Any, device: Any = None, threshold: float = 6.0, **kwargs: Any) -> None:
            super().__init__(*args, device=device, threshold=threshold, **kwargs)
            if _real_device(device).type != "meta":  # under init_module: never hold the whole float model
                self.quantize_()
            self._register_load_state_dict_pre_hook(self._load_hook)

        @property
        def is_quantized(self) -> bool:
            return bool(self.weight.dtype == torch.int8)

        def quantize_(self, weight: Tensor | None = None, device: torch.device | None = None) -> None:
            """Quantise ``weight`` (default: the float weight held) into this layer, on ``device``."""
            weight = self.weight.data if weight is None else weight
            if weight.dtype == torch.int8 or self.state.has_fp16_weights:
                return  # quantised already, or quantised in every forward (int8-training)
            w16 = weight.contiguous().to(device=device or weight.device, dtype=torch.float16)
            cb, scb, _ = bnb.functional.int8_vectorwise_quant(w16)
            self._set_int8(cb, scb)

        def _set_int8(self, cb: Tensor, scb: Tensor) -> None:
            self.weight = bnb.nn.Int8Params(cb, requires_grad=False, has_fp16_weights=False, CB=cb, SCB=scb)
            self.state.CB = self.state.SCB = None  # the forward takes them from the new weight

        def _adopt_float(self, weight: Tensor) -> None:
            has_fp16 = self.state.has_fp16_weights
            self.weight = bnb.nn.Int8Params(weight, requires_grad=has_fp16, has_fp16_weights=has_fp16)

        def _load_hook(self, state_dict: dict[str, Any], prefix: str, *_: Any) -> None:
            key = prefix + "weight"
            scb = state_dict.pop(prefix + "SCB", None)
            state_dict.pop(prefix + "weight_format", None)
            weight = state_dict.get(key)
            if weight is None:
                return
            device = self.weight.device
            if weight.dtype == torch.int8:  # a quantised checkpoint: its int8 values and scales, as they are
                if scb is None:
                    raise RuntimeError(f"{key!r} is int8 but the checkpoint has no scales ({prefix + 'SCB'!r}).")
                self._set_int8(weight.to(device), scb.to(device))
            elif self.is_quantized:  # a float checkpoint into a quantised layer: quantise it
                self.quantize_(weight, device)
            else:  # float into float: the default loading copies it
                self.state.CB = self.state.SCB = None  # int8-training: quantise the loaded weight in the next forward
                return
            # the default loading copies this onto the weight: no missing key, and strict loading still checks shapes
            state_dict[key] = self.weight.data

        def forward(self, x: Tensor) -> Tensor:
            if x.device.type == "cpu" and self.state.has_fp16_weights and not self.training:
                # bitsandbytes' eval path for trainable weights needs `int8_double_quant`, which has no CPU kernel;
                # its training path (quantise the weight, dequantise, matmul) computes the same product
                self.state.is_training = True
                if self.bias is not None and self.bias.dtype != x.dtype:
                    self.bias.data = self.bias.data.to(x.dtype)
                out: Tensor = bnb.matmul(x, self.weight, bias=self.bias, state=self.state)
                return out
            result: Tensor = super().forward(x)
            return result

        def reset_parameters(self) -> None:
            weight = self.weight
            if isinstance(weight, bnb.nn.Int8Params) and weight.dtype == torch.int8:
                weight = torch.empty(weight.shape, device=weight.device, dtype=torch.get_default_dtype())
            _init_linear(weight, self.bias)
            if weight is not self.weight:
                self.quantize_(weight)

    class _Linear4bit(bnb.nn.Linear4bit):  # type: ignore[misc]
        """``Linear4bit`` that quantises where it is created on a real device and loads float and 4-bit checkpoints."""

        weight: Any  # a Params4bit

        def __init__(self, *args: Any, device: Any = None, **kwargs: Any) -> None:
            super().__init__(*args, device=device, **kwargs)
            if _real_device(device).type != "meta":  # under init_module: never hold the whole float model
                self.quantize_()
            self._register_load_state_dict_pre_hook(self._load_hook)

        @property
        def is_quantized(self) -> bool:
            return bool(self.weight.bnb_quantized)

        def quantize_(self, weight: Tensor | None = None, device: torch.device | None = None) -> None:
            """Quantise ``weight`` (default: the float weight held) into this layer, on ``device``."""
            if weight is None:
                if self.is_quantized:
                    return
                weight = self.weight.data
            param = self.weight
            packed, quant_state = bnb.functional.quantize_4bit(
                weight.contiguous().to(device or weight.device),
                blocksize=param.blocksize,
                compress_statistics=param.compress_statistics,
                quant_type=param.quant_type,
                quant_storage=param.quant_storage,
            )
            self._set_4bit(packed, quant_state)

        def _set_4bit(self, packed: Tensor, quant_state: Any) -> None:
            old = self.weight
            self.weight = bnb.nn.Params4bit(
                packed,
                requires_grad=False,
                quant_state=quant_state,
                blocksize=quant_state.blocksize,
                compress_statistics=old.compress_statistics,
                quant_type=quant_state.quant_type,
                quant_storage=packed.dtype,
                module=self,
                bnb_quantized=True,
            )
            self.quant_state = quant_state

        def _adopt_float(self, weight: Tensor) -> None:
            old = self.weight
            self.weight = bnb.nn.Params4bit(
                weight,
                requires_grad=False,
                blocksize=old.blocksize,
                compress_statistics=old.compress_statistics,
                quant_type=old.quant_type,
                quant_storage=old.quant_storage,
                module=self,
            )

        def _load_hook(self, state_dict: dict[str, Any], prefix: str, *_: Any) -> None:
            key = prefix + "weight"
            stats = {k[len(key) + 1 :]: state_dict.pop(k) for k in list(state_dict) if k.startswith(key + ".")}
            weight = state_dict.get(key)
            if weight is None:
                return
            device = self.weight.device
            if stats:  # a quantised checkpoint: its packed values and quantisation state, as they are
                quant_state = bnb.functional.QuantState.from_dict(qs_dict=stats, device=device)
                self._set_4bit(weight.to(device), quant_state)
            elif self.is_quantized:  # a float checkpoint into a quantised layer: quantise it
                self.quantize_(weight, device)
            else:  # float into float: the default loading copies it, the move to the device quantises it
                return
            # the default loading copies this onto the weight: no missing key, and strict loading still checks shapes
            state_dict[key] = self.weight.data

        def reset_parameters(self) -> None:
            weight = self.weight
            if isinstance(weight, bnb.nn.Params4bit) and weight.bnb_quantized:
                weight = torch.empty(weight.quant_state.shape, device=weight.device, dtype=weight.quant_state.dtype)
            _init_linear(weight, self.bias)
            if weight is not self.weight:
                self.quantize_(weight)

    def preset(base: type[Module], name: str, **settings: Any) -> type[Module]:
        """A subclass of ``base`` whose constructor passes ``settings`` (a class, so that ``isinstance`` works)."""

        def __init__(self: Module, *args: Any, **kwargs: Any) -> None:
            base.__init__(self, *args, **settings, **kwargs)

        return type(name, (base,), {"__init__": __init__})

    return {
        "nf4": preset(_Linear4bit, "_NF4Linear", quant_type="nf4", compress_statistics=False),
        "nf4-dq": preset(_Linear4bit, "_NF4DQLinear", quant_type="nf4", compress_statistics=True),
        "fp4": preset(_Linear4bit, "_FP4Linear", quant_type="fp4", compress_statistics=False),
        "fp4-dq": preset(_Linear4bit, "_FP4DQLinear", quant_type="fp4", compress_statistics=True),
        "int8": preset(_Linear8bitLt, "_Int8LinearInference", has_fp16_weights=False),
        "int8-training": preset(_Linear8bitLt, "_Int8LinearTraining", has_fp16_weights=True),
    }


def _init_linear(weight: Tensor, bias: Tensor | None) -> None:
    """``torch.nn.Linear.reset_parameters`` on a float ``weight`` (kaiming uniform) and its bias."""
    torch.nn.init.kaiming_uniform_(weight, a=math.sqrt(5))
    if bias is not None:
        fan_in = weight.shape[1]
        bound = 1 / math.sqrt(fan_in) if fan_in > 0 else 0
        torch.nn.init.uniform_(bias, -bound, bound)


def _convert_layers(module: Module, linear_cls: type[Module], ignore_modules: set[str], prefix: str = "") -> None:
    """Replace every ``torch.nn.Linear`` under ``module`` whose qualified name starts with none of
    ``ignore_modules`` by ``linear_cls`` holding the same float weight (not quantised yet) and the same bias."""
    for name, child in module.named_children():
        fullname = f"{prefix}.{name}" if prefix else name
        if not isinstance(child, torch.nn.Linear) or any(fullname.startswith(s) for s in ignore_modules):
            _convert_layers(child, linear_cls, ignore_modules, prefix=fullname)
            continue
        # created on the meta device: no memory, no initialisation, no quantisation of random weights
        layer = linear_cls(child.in_features, child.out_features, bias=child.bias is not None, device="meta")
        layer._adopt_float(child.weight.data)  # type: ignore[operator]
        layer.bias = child.bias  # the same Parameter: an optimizer that holds it keeps working
        layer.train(child.training)
        setattr(module, name, layer)
