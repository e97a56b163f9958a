"""Lightning Fabric's XLA/TPU and Transformer Engine names exist at Lightning's paths, report no hardware, and say
what is missing when built (fabric_lite computes on CPU, CUDA and MPS devices only)."""

from __future__ import annotations

import importlib
import subprocess
import sys
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


LEGACY_TPU_NAMES = [
    ("fabric_lite.accelerators", "TPUAccelerator", ()),
    ("fabric_lite.accelerators.tpu", "TPUAccelerator", ()),
    ("fabric_lite.plugins", "TPUPrecision", ()),
    ("fabric_lite.plugins.precision.tpu", "TPUPrecision", ()),
    ("fabric_lite.plugins", "TPUBf16Precision", ()),
    ("fabric_lite.plugins.precision.tpu_bf16", "TPUBf16Precision", ()),
    ("fabric_lite.plugins", "XLABf16Precision", ()),
    ("fabric_lite.plugins.precision", "XLABf16Precision", ()),
    ("fabric_lite.plugins.precision.xlabf16", "XLABf16Precision", ()),
    ("fabric_lite.strategies", "SingleTPUStrategy", (torch.device("cpu"),)),
    ("fabric_lite.strategies.single_tpu", "SingleTPUStrategy", (0,)),
]


@pytest.mark.parametrize(("module", "name", "args"), LEGACY_TPU_NAMES, ids=[f"{m}.{n}" for m, n, _ in LEGACY_TPU_NAMES])
def test_lightnings_former_tpu_names_warn_then_name_torch_xla(module: str, name: str, args: tuple[Any, ...]) -> None:
    """Lightning's names before XLA: at their former paths and in the packages, deprecated, and never available."""
    cls = getattr(importlib.import_module(module), name)
    with pytest.deprecated_call(match="is deprecated"), pytest.raises(ModuleNotFoundError, match="torch_xla"):
        cls(*args)


def test_the_former_tpu_names_are_not_imported_with_their_packages() -> None:
    code = (
        "import sys, fabric_lite.accelerators, fabric_lite.plugins, fabric_lite.strategies\n"
        "legacy = ['accelerators.tpu', 'plugins.precision.tpu', 'plugins.precision.tpu_bf16',"
        " 'plugins.precision.xlabf16', 'strategies.single_tpu']\n"
        "print([m for m in legacy if 'fabric_lite.' + m in sys.modules])\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert done.stdout.strip() == "[]"
