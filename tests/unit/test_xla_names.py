"""Lightning Fabric's XLA/TPU and Transformer Engine names exist at Lightning's paths, report no hardware, and say
what is missing when built (fabric_lite computes on CPU, CUDA and MPS devices only)."""

from __future__ import annotations

import importlib
from typing import Any
from unittest.mock import Mock

import pytest
import torch

from fabric_lite.accelerators import ACCELERATOR_REGISTRY, Accelerator, XLAAccelerator
from fabric_lite.plugins.environments import XLAEnvironment
from fabric_lite.strategies import STRATEGY_REGISTRY, ParallelStrategy, Strategy

XLA_CLASSES = [
    ("fabric_lite.accelerators", "XLAAccelerator", ()),
    ("fabric_lite.plugins", "XLAPrecision", ("bf16-true",)),
    ("fabric_lite.plugins", "XLACheckpointIO", ()),
    ("fabric_lite.plugins.environments", "XLAEnvironment", ()),
    ("fabric_lite.strategies", "XLAStrategy", ()),
    ("fabric_lite.strategies", "XLAFSDPStrategy", ()),
    ("fabric_lite.strategies", "SingleDeviceXLAStrategy", (0,)),
    ("fabric_lite.strategies.launchers.xla", "_XLALauncher", (None,)),
]


@pytest.mark.parametrize(("module", "name", "args"), XLA_CLASSES, ids=[name for _, name, _ in XLA_CLASSES])
def test_building_an_xla_object_names_torch_xla(module: str, name: str, args: tuple[Any, ...]) -> None:
    cls = getattr(importlib.import_module(module), name)
    with pytest.raises(ModuleNotFoundError, match=f"^{name} needs torch_xla and an XLA device.*pip install torch_xla"):
        cls(*args)


def test_xla_classes_work_in_type_checks_and_mocks() -> None:
    from fabric_lite.strategies import XLAStrategy

    assert issubclass(XLAStrategy, ParallelStrategy) and issubclass(XLAAccelerator, Accelerator)
    assert not isinstance(Mock(), XLAStrategy)
    assert isinstance(Mock(spec=XLAStrategy), Strategy)  # what code that mocks a strategy by its class relies on
    assert XLAAccelerator.is_available() is False and XLAAccelerator.auto_device_count() == 0
    assert XLAEnvironment.detect() is False


def test_registries_list_lightnings_xla_names() -> None:
    assert ACCELERATOR_REGISTRY["tpu"]["accelerator"] is XLAAccelerator
    assert {"xla", "xla_fsdp", "single_xla", "single_tpu"} <= set(STRATEGY_REGISTRY)
    with pytest.raises(ModuleNotFoundError, match="torch_xla"):
        ACCELERATOR_REGISTRY.get("tpu")


def test_xla_helpers_raise_when_called() -> None:
    from fabric_lite.strategies.xla_fsdp import _activation_checkpointing_auto_wrapper

    with pytest.raises(ModuleNotFoundError, match="XLA's activation checkpointing needs torch_xla"):
        _activation_checkpointing_auto_wrapper({torch.nn.Linear}, torch.nn.Linear(1, 1))
    with pytest.raises(ModuleNotFoundError, match=r"XLAAccelerator\.get_parallel_devices needs torch_xla"):
        XLAAccelerator.get_parallel_devices(8)


def test_transformer_engine_precision_names_what_is_missing() -> None:
    from fabric_lite.plugins import TransformerEnginePrecision

    with pytest.raises(ModuleNotFoundError, match=r"transformer_engine.*use precision='bf16-mixed'"):
        TransformerEnginePrecision(weights_dtype=torch.bfloat16)
