"""Device parsing at Lightning Fabric's paths: ``utilities.device_parser``, the accelerators' ``name()``,
``parse_devices`` and ``get_parallel_devices``, ``_parse_cpu_cores``, and the one parser underneath that the plan
uses too (``utilities._device_ids``)."""

from __future__ import annotations

import logging
from typing import Any
from unittest import mock

import pytest
import torch

from fabric_lite.accelerators import cuda as cuda_module
from fabric_lite.accelerators import mps as mps_module
from fabric_lite.accelerators.accelerator import Accelerator, accelerator_name
from fabric_lite.accelerators.cpu import CPUAccelerator, _parse_cpu_cores
from fabric_lite.accelerators.cuda import CUDAAccelerator, _check_cuda_matmul_precision, find_usable_cuda_devices
from fabric_lite.accelerators.mps import MPSAccelerator
from fabric_lite.utilities import device_parser
from fabric_lite.utilities._device_ids import parse_device_ids
from fabric_lite.utilities.exceptions import MisconfigurationException


@pytest.fixture
def four_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    """What the machine reports, through Lightning's function (as Lightning's tests patch it)."""
    monkeypatch.setattr(cuda_module, "num_cuda_devices", lambda: 4)


@pytest.mark.parametrize(
    ("devices", "expected"),
    [
        (0, None),
        ("0", None),
        ([], None),
        (1, [0]),
        (3, [0, 1, 2]),
        (-1, [0, 1, 2, 3]),
        ("-1", [0, 1, 2, 3]),
        ([3, 1], [3, 1]),
        ((1, 3), [1, 3]),
        ("3", [0, 1, 2]),
        (" 1, 3 ", [1, 3]),
        ("2,", [2]),
    ],
)
def test_parse_gpu_ids(four_gpus: None, devices: Any, expected: list[int] | None) -> None:
    assert device_parser._parse_gpu_ids(devices, include_cuda=True) == expected
    assert CUDAAccelerator.parse_devices(devices) == expected


@pytest.mark.parametrize(
    ("devices", "error", "fragment"),
    [
        (0.5, TypeError, "must be an int, a string, a sequence of ints, but you passed 0.5"),
        (False, TypeError, "but you passed False"),
        (None, TypeError, "but you passed None"),
        (["0"], TypeError, "you passed a sequence of str"),
        ([None], TypeError, "you passed a sequence of NoneType"),
        ("gpu", TypeError, "'gpu', which is no number or list of indices"),
        (-2, MisconfigurationException, "-1 for every GPU"),
        ([0, 0], MisconfigurationException, "Device ID's (GPU) must be unique"),
        ([1, 7], MisconfigurationException, "You requested gpu: [1, 7]\n But your machine only has: [0, 1, 2, 3]"),
        ([-1], MisconfigurationException, "([-1] missing)"),
    ],
)
def test_parse_gpu_ids_refuses(four_gpus: None, devices: Any, error: type[Exception], fragment: str) -> None:
    with pytest.raises(error) as excinfo:
        device_parser._parse_gpu_ids(devices, include_cuda=True)
    assert fragment in str(excinfo.value)


@pytest.mark.parametrize("devices", [-1, "-1", 1, [0]])
def test_no_gpu_to_parse(monkeypatch: pytest.MonkeyPatch, devices: Any) -> None:
    monkeypatch.setattr(cuda_module, "num_cuda_devices", lambda: 0)
    with pytest.raises(MisconfigurationException):
        device_parser._parse_gpu_ids(devices, include_cuda=True)


def test_one_visible_gpu_per_process_under_torchelastic(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cuda_module, "num_cuda_devices", lambda: 1)
    with mock.patch("torch.distributed.is_torchelastic_launched", return_value=True):
        assert device_parser._parse_gpu_ids(2, include_cuda=True) == [0, 1]  # counts the node's processes
    with pytest.raises(MisconfigurationException):
        device_parser._parse_gpu_ids(2, include_cuda=True)


def test_the_machine_side_of_the_parser(four_gpus: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(MPSAccelerator, "is_available", staticmethod(lambda: True))
    assert device_parser._get_all_available_gpus(include_cuda=True) == [0, 1, 2, 3]
    assert device_parser._get_all_available_gpus(include_mps=True) == [0]
    assert mps_module._get_all_available_mps_gpus() == [0]
    assert device_parser._sanitize_gpu_ids([2], include_cuda=True) == [2]
    with pytest.raises(ValueError, match="At least one gpu type should be specified"):
        device_parser._sanitize_gpu_ids([0])
    assert MPSAccelerator.get_parallel_devices(1) == [torch.device("mps", 0)]
    with pytest.raises(MisconfigurationException, match="But your machine only has: \\[0\\]"):
        MPSAccelerator.parse_devices(2)


@pytest.mark.parametrize(("gpus", "root"), [(None, None), ([0], 0), ([3, 1], 3)])
def test_determine_root_gpu_device(gpus: list[int] | None, root: int | None) -> None:
    assert device_parser._determine_root_gpu_device(gpus) == root  # type: ignore[arg-type]


def test_determine_root_gpu_device_refuses() -> None:
    with pytest.raises(TypeError, match="GPUs should be a list"):
        device_parser._determine_root_gpu_device((0,))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="GPUs should be a non-empty list"):
        device_parser._determine_root_gpu_device([])


def test_the_pure_parser_reads_nothing() -> None:
    assert parse_device_ids("0,2", range(3)) == [0, 2]
    assert parse_device_ids(-1, range(2)) == [0, 1]
    assert parse_device_ids(3, range(1), one_device_per_process=True) == [0, 1, 2]
    with pytest.raises(MisconfigurationException, match=r"machine only has: \[0, \.\.\., 99\]"):
        parse_device_ids([200], range(100))  # a long range is shown short


# ------------------------------------------------------------------------------------------------- accelerators
@pytest.mark.parametrize(("cls", "name"), [(CPUAccelerator, "cpu"), (CUDAAccelerator, "cuda"), (MPSAccelerator, "mps")])
def test_a_built_in_name_reads_as_a_string_and_as_lightnings_static_method(cls: type[Accelerator], name: str) -> None:
    assert cls.name == name and cls.name() == name  # type: ignore[operator]
    assert cls().name() == name and accelerator_name(cls) == name  # type: ignore[operator]


def test_a_custom_accelerator_declares_its_name_either_way() -> None:
    class AsAttribute(CPUAccelerator):
        name = "attribute"

    class AsStaticMethod(CPUAccelerator):
        @staticmethod
        def name() -> str:  # type: ignore[override]
            return "static"

    assert (accelerator_name(AsAttribute), accelerator_name(AsStaticMethod())) == ("attribute", "static")


def test_cpu_devices(monkeypatch: pytest.MonkeyPatch) -> None:
    assert CPUAccelerator.parse_devices("3") == 3
    assert CPUAccelerator.get_parallel_devices(2) == [torch.device("cpu")] * 2
    for value in ([3], -1, 0, True, "²", "x"):
        with pytest.raises(TypeError) as excinfo:
            _parse_cpu_cores(value)  # type: ignore[arg-type]
        assert f"`CPUAccelerator` should be an int > 0 (the number of processes), got {value!r}." in str(excinfo.value)


def test_cuda_parallel_devices_and_wrong_devices() -> None:
    assert CUDAAccelerator.get_parallel_devices([3, 1]) == [torch.device("cuda", 3), torch.device("cuda", 1)]
    for accelerator, device, kind in [
        (CPUAccelerator(), "cuda", "CPU"),
        (CUDAAccelerator(), "cpu", "CUDA"),
        (MPSAccelerator(), "cpu", "MPS"),
    ]:
        with pytest.raises(ValueError, match=f"Device should be {kind}, got {device} instead"):
            accelerator.setup_device(torch.device(device))


def test_a_base_accelerator_without_device_parsing_says_what_to_define() -> None:
    with pytest.raises(NotImplementedError, match="define it as a static method"):
        Accelerator.parse_devices(1)
    with pytest.raises(NotImplementedError, match="get_parallel_devices"):
        Accelerator.get_parallel_devices(1)


def test_find_usable_cuda_devices_counts_through_lightnings_function(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cuda_module, "num_cuda_devices", lambda: 3)
    with mock.patch.object(cuda_module.torch, "tensor"):
        assert find_usable_cuda_devices(-1) == [0, 1, 2]
    with pytest.raises(ValueError, match="this machine only has 3 GPUs"):
        find_usable_cuda_devices(4)


def test_the_tensor_core_hint_is_given_once(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(cuda_module, "rank_zero_info", logging.getLogger("hint").info)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "H100")
    _check_cuda_matmul_precision.cache_clear()
    try:
        with caplog.at_level(logging.INFO, logger="hint"):
            _check_cuda_matmul_precision(torch.device("cuda", 0))
            _check_cuda_matmul_precision(torch.device("cuda", 0))
        hints = [r.message for r in caplog.records if "that has Tensor Cores" in r.message]
        assert len(hints) == 1 and "('H100')" in hints[0] and "set_float32_matmul_precision('high')" in hints[0]
    finally:
        _check_cuda_matmul_precision.cache_clear()
