"""TransformerEnginePrecision with a small fake ``transformer_engine`` package in ``sys.modules`` (the real one needs a
CUDA build): the precision names, the recipe, the layer replacement, the contexts, and a forward through ``Fabric``.

The fake layers subclass torch's and say they come from ``transformer_engine.pytorch``, which is how the plugin
recognises a model that already holds Transformer Engine layers.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import sys
import types
import warnings
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from torch import nn

import fabric_lite.plugins.precision.transformer_engine as te_module
from fabric_lite import Fabric
from fabric_lite.plugins.precision import TransformerEnginePrecision
from fabric_lite.utilities.imports import _Availability


class Format(enum.Enum):
    E4M3 = "e4m3"
    HYBRID = "hybrid"


@dataclasses.dataclass
class DelayedScaling:
    fp8_format: Format = Format.HYBRID
    amax_history_len: int = 1024


class Linear(nn.Linear):
    __module__ = "transformer_engine.pytorch"


class LayerNorm(nn.LayerNorm):
    __module__ = "transformer_engine.pytorch"

    def __init__(self, hidden_size: int, eps: float = 1e-5) -> None:
        super().__init__(hidden_size, eps=eps)


class FakeTransformerEngine:
    """The fake package's modules, and the arguments of every ``fp8_autocast`` entered."""

    def __init__(self) -> None:
        self.fp8_autocasts: list[dict[str, Any]] = []
        self.root = types.ModuleType("transformer_engine")
        self.pytorch = types.ModuleType("transformer_engine.pytorch")
        self.common = types.ModuleType("transformer_engine.common")
        self.recipe = types.ModuleType("transformer_engine.common.recipe")
        self.pytorch.Linear = Linear  # type: ignore[attr-defined]
        self.pytorch.LayerNorm = LayerNorm  # type: ignore[attr-defined]
        self.pytorch.fp8_autocast = self.fp8_autocast  # type: ignore[attr-defined]
        self.recipe.DelayedScaling = DelayedScaling  # type: ignore[attr-defined]
        self.recipe.Format = Format  # type: ignore[attr-defined]
        self.root.pytorch = self.pytorch  # type: ignore[attr-defined]
        self.root.common = self.common  # type: ignore[attr-defined]
        self.common.recipe = self.recipe  # type: ignore[attr-defined]

    @contextlib.contextmanager
    def fp8_autocast(self, **kwargs: Any) -> Iterator[None]:
        self.fp8_autocasts.append(kwargs)
        yield


@pytest.fixture
def fake_te(monkeypatch: pytest.MonkeyPatch) -> FakeTransformerEngine:
    fake = FakeTransformerEngine()
    for module in (fake.root, fake.pytorch, fake.common, fake.recipe):
        monkeypatch.setitem(sys.modules, module.__name__, module)
    monkeypatch.setattr(te_module, "_TRANSFORMER_ENGINE_AVAILABLE", True)
    return fake


class Block(nn.Module):
    def __init__(self, bias: bool = True) -> None:
        super().__init__()
        self.fits = nn.Linear(16, 32, bias=bias)
        self.norm = nn.LayerNorm(32)
        self.inner = nn.Sequential(nn.Linear(32, 48), nn.ReLU(), nn.Linear(48, 3))  # 3 outputs: not a multiple of 16


# ------------------------------------------------------------------------------------------------- not installed


def test_without_transformer_engine_the_error_names_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(te_module, "_TRANSFORMER_ENGINE_AVAILABLE", _Availability("no_such_package_for_te_test"))
    with pytest.raises(ModuleNotFoundError, match=r"transformer_engine.*pip install 'transformer_engine\[pytorch\]'"):
        TransformerEnginePrecision(weights_dtype=torch.bfloat16)
    with pytest.raises(ModuleNotFoundError, match="transformer_engine"):
        Fabric(accelerator="cpu", precision="transformer-engine")


# ------------------------------------------------------------------------------------------------- names and recipe


@pytest.mark.parametrize(
    ("name", "dtype"), [("transformer-engine", torch.bfloat16), ("transformer-engine-float16", torch.float16)]
)
def test_precision_names_build_the_plugin(fake_te: FakeTransformerEngine, name: str, dtype: torch.dtype) -> None:
    fabric = Fabric(accelerator="cpu", precision=name)  # type: ignore[arg-type]
    precision = fabric.strategy.precision
    assert isinstance(precision, TransformerEnginePrecision)
    assert (precision.weights_dtype, precision.fallback_compute_dtype, precision.precision) == (dtype, dtype, name)
    assert precision.recipe == DelayedScaling()


def test_plugin_instance_and_matching_name(fake_te: FakeTransformerEngine) -> None:
    plugin = TransformerEnginePrecision(weights_dtype=torch.float16, fallback_compute_dtype=torch.bfloat16)
    fabric = Fabric(accelerator="cpu", precision="transformer-engine-float16", plugins=[plugin])
    assert fabric.strategy.precision is plugin
    assert plugin.fallback_compute_dtype is torch.bfloat16
    with pytest.raises(ValueError, match="transformer-engine-float16"):
        Fabric(accelerator="cpu", precision="transformer-engine", plugins=[plugin])


def test_recipe_from_a_mapping_or_as_given(fake_te: FakeTransformerEngine) -> None:
    arguments = {"fp8_format": "E4M3", "amax_history_len": 16}
    precision = TransformerEnginePrecision(weights_dtype=torch.bfloat16, recipe=arguments)
    assert precision.recipe == DelayedScaling(fp8_format=Format.E4M3, amax_history_len=16)
    assert arguments == {"fp8_format": "E4M3", "amax_history_len": 16}  # the caller's mapping is not changed
    recipe = DelayedScaling(amax_history_len=4)
    assert TransformerEnginePrecision(weights_dtype=torch.bfloat16, recipe=recipe).recipe is recipe


# ------------------------------------------------------------------------------------------------- convert_module


@pytest.mark.parametrize("bias", [True, False])
def test_convert_module_replaces_layers_with_their_weights(fake_te: FakeTransformerEngine, bias: bool) -> None:
    model = Block(bias=bias)
    with torch.no_grad():
        model.norm.weight.uniform_()
        model.norm.bias.uniform_()
    expected = {name: tensor.to(torch.bfloat16) for name, tensor in model.state_dict().items()}
    precision = TransformerEnginePrecision(weights_dtype=torch.bfloat16)
    with pytest.warns(UserWarning, match=r"divisible by 8 and 16.*'2'"):
        converted = precision.convert_module(model)
    assert converted is model
    assert type(model.fits) is Linear
    assert type(model.norm) is LayerNorm
    assert model.norm.eps == 1e-5
    assert type(model.inner[0]) is Linear
    assert type(model.inner[2]) is nn.Linear  # 3 output features: kept, with the warning
    assert (model.fits.bias is None) is not bias
    state = model.state_dict()
    assert state.keys() == expected.keys()
    for name, tensor in expected.items():
        assert state[name].dtype is torch.bfloat16
        torch.testing.assert_close(state[name], tensor, rtol=0, atol=0, msg=name)


def test_convert_module_keeps_layers_when_told_or_already_converted(fake_te: FakeTransformerEngine) -> None:
    precision = TransformerEnginePrecision(weights_dtype=torch.float16, replace_layers=False)
    model = precision.convert_module(Block())
    assert type(model.fits) is nn.Linear
    assert model.fits.weight.dtype is torch.float16

    precision = TransformerEnginePrecision(weights_dtype=torch.bfloat16, replace_layers=True)
    model = nn.Sequential(Linear(16, 16), nn.Linear(16, 16))
    precision.convert_module(model)  # a model with a Transformer Engine layer is the user's choice: left as it is
    assert type(model[1]) is nn.Linear
    assert model[1].weight.dtype is torch.bfloat16


def test_convert_module_keeps_a_multidimensional_layer_norm(fake_te: FakeTransformerEngine) -> None:
    model = nn.Sequential(nn.LayerNorm([4, 8]))
    TransformerEnginePrecision(weights_dtype=torch.bfloat16).convert_module(model)
    assert type(model[0]) is nn.LayerNorm  # Transformer Engine's LayerNorm normalises over one dimension


# ------------------------------------------------------------------------------------------------- contexts


def test_module_init_context_sets_dtype_and_replaces_classes(fake_te: FakeTransformerEngine) -> None:
    precision = TransformerEnginePrecision(weights_dtype=torch.float16)
    context = precision.module_init_context()
    assert torch.get_default_dtype() is torch.float32  # nothing happens before the block is entered
    with pytest.raises(RuntimeError, match="inside"), context:
        assert torch.get_default_dtype() is torch.float16
        raise RuntimeError("inside")
    assert torch.get_default_dtype() is torch.float32

    with precision.module_init_context():
        model = Block()
    assert type(model.fits) is nn.Linear  # replace_layers=None: replaced at setup, not here
    assert model.fits.weight.dtype is torch.float16

    precision.replace_layers = True
    with precision.module_init_context():
        model = Block()
    assert (type(model.fits), type(model.norm), type(model.inner[2])) == (Linear, LayerNorm, Linear)
    assert model.fits.weight.dtype is torch.float16
    assert (nn.Linear.__module__, nn.LayerNorm.__module__) == (
        "torch.nn.modules.linear",
        "torch.nn.modules.normalization",
    )
    assert torch.nn.Linear is nn.modules.linear.Linear


def test_forward_context_enters_fp8_autocast_with_the_recipe(fake_te: FakeTransformerEngine) -> None:
    precision = TransformerEnginePrecision(weights_dtype=torch.bfloat16, recipe={"amax_history_len": 2})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.autocast("cuda") without a CUDA device warns and does nothing
        with precision.forward_context():
            assert torch.get_default_dtype() is torch.bfloat16
            assert fake_te.fp8_autocasts == [{"enabled": True, "fp8_recipe": DelayedScaling(amax_history_len=2)}]
    assert torch.get_default_dtype() is torch.float32


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_forward_context_falls_back_to_autocast_on_cuda(fake_te: FakeTransformerEngine) -> None:
    precision = TransformerEnginePrecision(weights_dtype=torch.bfloat16, fallback_compute_dtype=torch.float16)
    with precision.forward_context():
        assert torch.is_autocast_enabled("cuda")
        assert torch.get_autocast_dtype("cuda") is torch.float16
    assert not torch.is_autocast_enabled("cuda")


def test_inputs_and_outputs_are_converted(fake_te: FakeTransformerEngine) -> None:
    precision = TransformerEnginePrecision(weights_dtype=torch.float16)
    data = {"x": torch.ones(2), "ids": torch.arange(2)}
    converted = precision.convert_input(data)
    assert (converted["x"].dtype, converted["ids"].dtype) == (torch.float16, torch.int64)
    assert precision.convert_output(converted)["x"].dtype is torch.float32


def test_fabric_setup_and_forward(fake_te: FakeTransformerEngine) -> None:
    fabric = Fabric(accelerator="cpu", precision="transformer-engine")
    model = fabric.setup(nn.Sequential(nn.Linear(16, 32), nn.LayerNorm(32)))
    assert (type(model.module[0]), type(model.module[1])) == (Linear, LayerNorm)
    assert model.module[0].weight.dtype is torch.bfloat16
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.autocast("cuda") on a machine without CUDA
        output = model(torch.ones(2, 16))
    assert output.dtype is torch.float32
    assert len(fake_te.fp8_autocasts) == 1
