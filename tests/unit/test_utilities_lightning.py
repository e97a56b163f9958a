"""The utilities at Lightning Fabric's module paths, in one process: rank-zero helpers, warnings, ``LightningEnum``,
``Throughput``, ``measure_flops``, ``get_available_flops``, ``SpikeDetection``, ``get_filesystem``, the data, seed,
apply_func, types and distributed helpers, and the accelerator registry.

Multi-process behaviour is in tests/distributed/test_utilities_dist.py, the side-by-side comparison with Lightning in
tests/compat/test_utilities_compat.py.
"""

from __future__ import annotations

import io
import json
import logging
import os
import random
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, IterableDataset, Sampler

import fabric_lite.utilities as utilities
from fabric_lite import Fabric
from fabric_lite.accelerators import (
    ACCELERATOR_REGISTRY,
    ACCELERATORS,
    Accelerator,
    CPUAccelerator,
    find_usable_cuda_devices,
)
from fabric_lite.accelerators.registry import _AcceleratorRegistry
from fabric_lite.utilities import apply_func, data, rank_zero, seed, types
from fabric_lite.utilities.cloud_io import _is_local_file_protocol, get_filesystem
from fabric_lite.utilities.distributed import DistributedSamplerWrapper, is_shared_filesystem
from fabric_lite.utilities.enums import LightningEnum
from fabric_lite.utilities.exceptions import MisconfigurationException
from fabric_lite.utilities.rank_zero import (
    LightningDeprecationWarning,
    WarningCache,
    rank_prefixed_message,
    rank_zero_debug,
    rank_zero_deprecation,
    rank_zero_info,
    rank_zero_only,
    rank_zero_warn,
)
from fabric_lite.utilities.spike import SpikeDetection, TrainingSpikeException
from fabric_lite.utilities.throughput import (
    Throughput,
    ThroughputMonitor,
    _cuda_flops,
    get_available_flops,
    measure_flops,
)
from fabric_lite.utilities.warnings import PossibleUserWarning, disable_possible_user_warnings
from tests.helpers.harness import base_env, run_python


@pytest.fixture
def rank(monkeypatch: pytest.MonkeyPatch) -> Any:
    """Set ``rank_zero_only.rank`` for one test (restored afterwards)."""

    def set_rank(value: int | None) -> None:
        monkeypatch.setattr(rank_zero_only, "rank", value)

    set_rank(0)
    return set_rank


# ---------------------------------------------------------------------------------------------------- rank zero
def test_rank_zero_only_runs_on_rank_zero_and_returns_the_default_elsewhere(rank: Any) -> None:
    calls: list[int] = []

    @rank_zero_only
    def work(x: int) -> int:
        calls.append(x)
        return x * 2

    with_default = rank_zero_only(lambda: "ran", default="skipped")
    assert (work(3), with_default()) == (6, "ran")
    rank(1)  # read at call time, not when decorating
    assert (work(4), with_default()) == (None, "skipped")
    assert calls == [3]
    assert work.__name__ == "work"  # functools.wraps


def test_rank_zero_only_without_a_rank_raises(rank: Any) -> None:
    rank(None)
    with pytest.raises(RuntimeError, match=r"rank_zero_only\.rank"):
        rank_zero_only(print)("x")


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, 0),
        ({"RANK": "3", "LOCAL_RANK": "1"}, 3),
        ({"LOCAL_RANK": "2", "SLURM_PROCID": "5"}, 2),  # LOCAL_RANK before SLURM_PROCID
        ({"SLURM_PROCID": "5", "JSM_NAMESPACE_RANK": "6"}, 5),
        ({"JSM_NAMESPACE_RANK": "6"}, 6),
        ({"RANK": "not-a-number", "LOCAL_RANK": "4"}, 4),
    ],
)
def test_rank_at_import_comes_from_the_environment(env: dict[str, str], expected: int) -> None:
    code = "from fabric_lite.utilities.rank_zero import rank_zero_only; print(rank_zero_only.rank)"
    environment = {k: v for k, v in base_env().items() if k not in ("SLURM_PROCID", "JSM_NAMESPACE_RANK")}
    done = run_python(["-c", code], env={**environment, **env}, timeout=60)
    assert done.returncode == 0, done.output
    assert done.stdout.strip() == str(expected)


def test_rank_zero_warn_points_at_the_caller_and_is_silent_elsewhere(rank: Any) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        rank_zero_warn("careful", category=PossibleUserWarning)
        rank(1)
        rank_zero_warn("not shown")
    assert [(str(w.message), w.category) for w in caught] == [("careful", PossibleUserWarning)]
    assert caught[0].filename == __file__


def test_rank_zero_deprecation_uses_lightnings_category(rank: Any) -> None:
    with pytest.warns(LightningDeprecationWarning, match="old") as caught:
        rank_zero_deprecation("old")
    assert issubclass(LightningDeprecationWarning, DeprecationWarning)
    assert caught[0].filename == __file__
    with pytest.warns(FutureWarning):
        rank_zero_deprecation("old", category=FutureWarning)


def test_rank_zero_info_and_debug_log_on_rank_zero_only(rank: Any, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG, logger="fabric_lite.utilities.rank_zero"):
        rank_zero_info("epoch %d", 1)
        rank_zero_debug("detail")
        rank(1)
        rank_zero_info("hidden")
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [("INFO", "epoch 1"), ("DEBUG", "detail")]
    assert caplog.records[0].filename == Path(__file__).name  # stacklevel: the caller's line


def test_warning_cache_emits_each_message_once(rank: Any, caplog: pytest.LogCaptureFixture) -> None:
    cache = WarningCache()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            cache.warn("a")
            cache.deprecation("b")
    assert [(str(w.message), w.category) for w in caught] == [("a", UserWarning), ("b", LightningDeprecationWarning)]
    with caplog.at_level(logging.INFO, logger="fabric_lite.utilities.rank_zero"):
        cache.info("c")
        cache.info("c")
    assert [r.getMessage() for r in caplog.records] == ["c"]
    assert cache == {"a", "b", "c"}


def test_rank_prefixed_message() -> None:
    assert rank_prefixed_message("hello", 2) == "[rank: 2] hello"
    assert rank_prefixed_message("hello", 0) == "[rank: 0] hello"
    assert rank_prefixed_message("hello", None) == "hello"


# ---------------------------------------------------------------------------------------------------- warnings
def test_disable_possible_user_warnings() -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        disable_possible_user_warnings()
        warnings.warn("hidden", PossibleUserWarning, stacklevel=1)
        warnings.warn("shown", UserWarning, stacklevel=1)
    assert [str(w.message) for w in caught] == ["shown"]


def test_disable_possible_user_warnings_for_one_module() -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        disable_possible_user_warnings("some.other.module")
        warnings.warn("still shown", PossibleUserWarning, stacklevel=1)
    assert [str(w.message) for w in caught] == ["still shown"]
    assert issubclass(PossibleUserWarning, UserWarning)


# ---------------------------------------------------------------------------------------------------- enums
class Mode(LightningEnum):
    TRAIN = "Train"
    EVAL = "eval-mode"


def test_lightning_enum_compares_and_hashes_ignoring_case() -> None:
    assert Mode.TRAIN == "train" and Mode.TRAIN == "TRAIN" and Mode.TRAIN != "eval-mode"
    assert Mode.TRAIN != Mode.EVAL and Mode.EVAL == "EVAL-MODE"
    assert {Mode.TRAIN: 1}["train"] == 1 and len({Mode.TRAIN, "train"}) == 1
    assert isinstance(Mode.TRAIN, str)


def test_lightning_enum_from_str() -> None:
    assert Mode.from_str("train") is Mode.TRAIN
    assert Mode.from_str("EVAL-MODE", source="value") is Mode.EVAL
    assert Mode.from_str("eval", source="any") is Mode.EVAL
    with pytest.raises(ValueError, match=r"expected one of \['TRAIN', 'EVAL'\], but got eval-mode"):
        Mode.from_str("eval-mode")
    with pytest.raises(ValueError, match=r"\['TRAIN', 'EVAL', 'Train', 'eval-mode'\], but got x"):
        Mode.from_str("x", source="any")
    with pytest.warns(UserWarning, match="Invalid string"):
        assert Mode.try_from_str("x") is None


# ---------------------------------------------------------------------------------------------------- throughput
def test_throughput_rates_over_the_window() -> None:
    tp = Throughput(window_size=3)
    tp.update(time=1.0, batches=1, samples=4)
    assert tp.compute() == {"time": 1.0, "batches": 1, "samples": 4}  # window not full yet
    tp.update(time=2.0, batches=2, samples=8)
    tp.update(time=5.0, batches=4, samples=20)
    assert tp.compute() == {
        "time": 5.0,
        "batches": 4,
        "samples": 20,
        "device/batches_per_sec": 0.75,  # (4 - 1) / (5 - 1)
        "device/samples_per_sec": 4.0,  # (20 - 4) / 4
    }
    tp.update(time=6.0, batches=5, samples=24)  # the first update leaves the window
    assert tp.compute()["device/samples_per_sec"] == (24 - 8) / (6 - 2)


def test_throughput_global_items_flops_and_mfu() -> None:
    tp = Throughput(available_flops=100.0, world_size=4, window_size=2, separator="|")
    tp.update(time=1.0, batches=1, samples=2, lengths=10, flops=5)
    tp.update(time=3.0, batches=3, samples=6, lengths=30, flops=7)
    flops_per_sec = 7 * 4 / 2  # the window's flops minus the first, of all 4 devices, over 2 s
    assert tp.compute() == {
        "time": 3.0,
        "batches": 3,
        "samples": 6,
        "lengths": 30,
        "device|batches_per_sec": 1.0,
        "device|samples_per_sec": 2.0,
        "device|items_per_sec": 10.0,
        "batches_per_sec": 4.0,
        "samples_per_sec": 8.0,
        "items_per_sec": 40.0,
        "flops_per_sec": flops_per_sec,
        "device|flops_per_sec": flops_per_sec / 4,
        "device|mfu": flops_per_sec / 4 / 100.0,
    }
    tp.reset()
    with pytest.raises(IndexError):
        tp.compute()


def test_throughput_rejects_bad_updates_and_settings() -> None:
    tp = Throughput(window_size=4)
    tp.update(time=1.0, batches=1, samples=1)
    with pytest.raises(ValueError, match=r"Expected the value to increase, last: 1\.0, current: 1\.0"):
        tp.update(time=1.0, batches=2, samples=2)
    with pytest.raises(ValueError, match=r"Expected samples \(1\) to be greater or equal than batches \(2\)"):
        Throughput().update(time=1.0, batches=2, samples=1)
    with pytest.raises(ValueError, match=r"Expected lengths \(2\) to be greater or equal than samples \(3\)"):
        Throughput().update(time=1.0, batches=1, samples=3, lengths=2)
    with pytest.raises(RuntimeError, match="same number of samples"):
        tp = Throughput()
        tp.update(time=1.0, batches=1, samples=1)
        tp.update(time=2.0, batches=2, samples=2, lengths=2)
    with pytest.raises(ValueError, match="window_size=1"):
        Throughput(window_size=1)
    with pytest.raises(ValueError, match="world_size=0"):
        Throughput(world_size=0)


def test_throughput_monitor_logs_through_fabric(rank: Any) -> None:
    logged: list[tuple[dict[str, Any], int | None]] = []

    class ListLogger:
        def log_metrics(self, metrics: dict[str, Any], step: int | None = None) -> None:
            logged.append((dict(metrics), step))

    fabric = Fabric(accelerator="cpu", devices=1, loggers=ListLogger())
    monitor = ThroughputMonitor(fabric, window_size=2)
    assert (monitor.world_size, monitor.available_flops) == (1, None)  # no FLOPs figure for a CPU
    monitor.update(time=1.0, batches=1, samples=2)
    first = monitor.compute_and_log()
    monitor.update(time=2.0, batches=2, samples=4)
    second = monitor.compute_and_log(step=10)
    third = monitor.compute_and_log()
    assert first == {"time": 1.0, "batches": 1, "samples": 2}
    assert second == third == {**second, "device/batches_per_sec": 1.0, "device/samples_per_sec": 2.0}
    assert [step for _, step in logged] == [0, 10, 11]
    assert [m for m, _ in logged] == [first, second, third]
    rank(1)  # elsewhere than rank 0 everything is skipped
    assert monitor.compute_and_log() == {} and len(logged) == 3


def test_compute_dtype_of_each_precision() -> None:
    from fabric_lite.plugins.precision import DoublePrecision, HalfPrecision, MixedPrecision, Precision
    from fabric_lite.utilities.throughput import _plugin_to_compute_dtype

    assert _plugin_to_compute_dtype(Precision()) == torch.float32
    assert _plugin_to_compute_dtype(DoublePrecision()) == torch.float64
    assert _plugin_to_compute_dtype(HalfPrecision("bf16-true")) == torch.bfloat16
    assert _plugin_to_compute_dtype(HalfPrecision("16-true")) == torch.float16
    assert _plugin_to_compute_dtype(MixedPrecision("bf16-mixed", "cpu")) == torch.bfloat16
    with pytest.raises(RuntimeError, match="Expected a precision plugin, got 'bf16'"):
        _plugin_to_compute_dtype("bf16")  # type: ignore[arg-type]


def test_throughput_monitor_needs_a_launched_fabric() -> None:
    fabric = Fabric(accelerator="cpu", devices=2, strategy="ddp")
    with pytest.raises(RuntimeError, match="launch"):
        ThroughputMonitor(fabric)


def test_measure_flops_of_a_linear_layer_on_meta() -> None:
    with torch.device("meta"):
        model = torch.nn.Linear(32, 16)
        x = torch.randn(2, 32)
    forward = 2 * 2 * 32 * 16  # a (2, 32) @ (32, 16) matmul: a multiply and an add per term
    assert measure_flops(model, lambda: model(x)) == forward
    # backward: the weight's gradient only (x needs no gradient), one more matmul of the same size
    assert measure_flops(model, lambda: model(x), lambda y: y.sum()) == 2 * forward
    assert model.weight.device.type == "meta" and model.weight.grad is not None


def test_get_available_flops() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # as in Lightning, a CPU gets None without a warning
        assert get_available_flops(torch.device("cpu"), torch.float32) is None
    assert _cuda_flops("NVIDIA A100-SXM4-80GB", torch.bfloat16, tf32=False) == 312e12
    assert _cuda_flops("NVIDIA A100-SXM4-80GB", torch.float32, tf32=False) == 19.5e12
    assert _cuda_flops("NVIDIA A100-SXM4-80GB", torch.float32, tf32=True) == 156e12
    assert _cuda_flops("NVIDIA H100 80GB HBM3", torch.float16, tf32=False) == 989.4e12
    assert _cuda_flops("NVIDIA GeForce RTX 4080 SUPER", torch.int8, tf32=False) == 417.6e12
    assert _cuda_flops("NVIDIA GeForce RTX 3080 Ti", "int4", tf32=False) == 546.6e12
    with pytest.warns(UserWarning, match="'Tesla T4' does not support torch.bfloat16"):
        assert _cuda_flops("Tesla T4", torch.bfloat16, tf32=False) is None
    with pytest.warns(UserWarning, match="FLOPs not found for 'Imaginary GPU'"):
        assert _cuda_flops("Imaginary GPU", torch.float32, tf32=False) is None
    with pytest.warns(UserWarning, match="chip is 'nvidia h200'"):
        assert _cuda_flops("NVIDIA H200", torch.float32, tf32=False) is None


def test_get_available_flops_asks_is_ampere_or_later(monkeypatch: pytest.MonkeyPatch) -> None:
    # Lightning's private _is_ampere_or_later decides TF32; a test (or a client) patching it is heard
    from fabric_lite.accelerators import cuda

    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    assert cuda._is_ampere_or_later() and cuda._is_ampere_or_later(torch.device("cuda", 0))
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (7, 5))
    assert not cuda._is_ampere_or_later()
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA A100-SXM4-80GB")
    monkeypatch.setattr(torch, "get_float32_matmul_precision", lambda: "high")
    for ampere, flops in ((False, 19.5e12), (True, 156e12)):
        monkeypatch.setattr(cuda, "_is_ampere_or_later", lambda device=None, ampere=ampere: ampere)
        assert get_available_flops(torch.device("cuda"), torch.float32) == flops


def test_throughput_module_imports_nothing_heavy() -> None:
    code = (
        "import sys; import fabric_lite.utilities.throughput, fabric_lite.utilities.spike,"
        " fabric_lite.utilities.cloud_io; print(sorted(m for m in sys.modules if m.startswith(('fsspec',"
        " 'torch.utils.flop_counter', 'torch._dynamo', 'torchmetrics', 'lightning'))))"
    )
    done = run_python(["-c", code], timeout=60)
    assert done.returncode == 0, done.output
    assert done.stdout.strip() == "[]"


# ---------------------------------------------------------------------------------------------------- spike
def _feed(detector: SpikeDetection, losses: list[float]) -> tuple[list[int], str | None]:
    fabric = Fabric(accelerator="cpu", devices=1)
    seen: list[int] = []
    for batch_idx, value in enumerate(losses):
        try:
            detector.on_train_batch_end(fabric, torch.tensor(value), None, batch_idx)
        except TrainingSpikeException as err:
            return seen, str(err)
        seen.append(batch_idx)
    return seen, None


def test_spike_detection_raises_and_writes_the_batches_to_skip(tmp_path: Path) -> None:
    detector = SpikeDetection(window=3, exclude_batches_path=tmp_path / "out")
    seen, raised = _feed(detector, [2.0, 1.9, 1.8, 1.7, 6.0, 1.0])
    assert (seen, raised) == ([0, 1, 2, 3], "Training spike detected in batch 4")
    assert json.loads((tmp_path / "out" / "skip_batches.json").read_text()) == [3, 4]
    assert detector.bad_batches == [3, 4]


def test_spike_detection_tolerances(tmp_path: Path) -> None:
    path = str(tmp_path / "skip.json")
    # 5.0 is 3.0 above the mean 2.0: not >= rtol * mean = 4.0, so no spike
    assert _feed(SpikeDetection(window=2, exclude_batches_path=path), [2.0, 2.0, 5.0]) == ([0, 1, 2], None)
    # 6.0 is 4.0 above it: a spike
    assert _feed(SpikeDetection(window=2, exclude_batches_path=path), [2.0, 2.0, 6.0])[1] is not None
    # with atol=5 as well, both tolerances must be exceeded
    assert _feed(SpikeDetection(window=2, atol=5.0, exclude_batches_path=path), [2.0, 2.0, 6.0])[1] is None
    assert _feed(SpikeDetection(window=2, atol=1.0, rtol=None, exclude_batches_path=path), [2.0, 2.0, 3.5])[1]
    # an improvement is never a spike, however far from the mean
    assert _feed(SpikeDetection(window=2, exclude_batches_path=path), [100.0, 100.0, 1.0])[1] is None
    # mode="max": a drop is the spike
    assert _feed(SpikeDetection(mode="max", window=2, exclude_batches_path=path), [10.0, 10.0, 100.0])[1] is None
    assert _feed(SpikeDetection(mode="max", window=2, rtol=0.5, exclude_batches_path=path), [10.0, 10.0, 1.0])[1]
    # warmup: batches before it are never spikes
    assert _feed(SpikeDetection(window=2, warmup=3, exclude_batches_path=path), [1.0, 1.0, 50.0]) == ([0, 1, 2], None)


def test_spike_detection_non_finite_losses(tmp_path: Path) -> None:
    path = str(tmp_path / "skip.json")
    assert _feed(SpikeDetection(exclude_batches_path=path), [1.0, float("nan")]) == (
        [0],
        "Training spike detected in batch 1",
    )
    assert _feed(SpikeDetection(exclude_batches_path=path), [1.0, float("inf")])[1] is not None
    detector = SpikeDetection(finite_only=False, window=5, exclude_batches_path=path)
    assert _feed(detector, [1.0, float("nan"), 1.0]) == ([0, 1, 2], None)
    assert detector.state_dict()["running"] == [[1.0, 1], [1.0, 1]]  # the NaN is left out


def test_spike_detection_state_round_trip_and_validation(tmp_path: Path) -> None:
    detector = SpikeDetection(window=2, exclude_batches_path=tmp_path / "a.json")
    _feed(detector, [3.0, 2.0, 1.0])
    state = detector.state_dict()
    assert state["last_val"] == 1.0 and state["running"] == [[2.0, 1], [1.0, 1]]
    restored = SpikeDetection()
    restored.load_state_dict(json.loads(json.dumps(state)))
    assert restored.state_dict() == state
    # the restored detector judges the next loss against the restored mean of 1.5: 4.5 is 3.0 away (>= 2 * 1.5)
    assert _feed(restored, [4.5])[1] is None  # batch 0 is in the warmup
    with pytest.raises(ValueError, match="mode='avg'"):
        SpikeDetection(mode="avg")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="window=0"):
        SpikeDetection(window=0)


def test_spike_detection_defaults_to_the_working_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    detector = SpikeDetection(window=1)
    _feed(detector, [1.0, 10.0])
    assert detector.exclude_batches_path == os.path.join(str(tmp_path), "skip_batches.json")
    assert json.loads((tmp_path / "skip_batches.json").read_text()) == [0, 1]


# ---------------------------------------------------------------------------------------------------- cloud_io
def test_get_filesystem(tmp_path: Path) -> None:
    fsspec = pytest.importorskip("fsspec")
    fs = get_filesystem(tmp_path)
    assert isinstance(fs, fsspec.implementations.local.LocalFileSystem)
    fs.makedirs(str(tmp_path / "a" / "b"), exist_ok=True)
    assert (tmp_path / "a" / "b").is_dir()
    memory = get_filesystem("memory://bucket/x")
    assert type(memory).__name__ == "MemoryFileSystem"


def test_get_filesystem_without_fsspec(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "fsspec.core", None)  # makes `import fsspec.core` raise ImportError
    with pytest.raises(ImportError, match="pip install fsspec"):
        get_filesystem("/tmp")


def test_local_file_protocol() -> None:
    assert _is_local_file_protocol("/a/b") and _is_local_file_protocol("file:///a") and _is_local_file_protocol("a")
    assert not _is_local_file_protocol("s3://bucket") and not _is_local_file_protocol("simplecache::s3://b")


def test_a_checkpoint_for_an_object_store_is_uploaded_in_one_pipe_call(monkeypatch: pytest.MonkeyPatch) -> None:
    """One ``fs.pipe`` of the complete bytes (s3fs and gcsfs send the parts of a large one in parallel), never a file
    opened for writing, and no ``makedirs`` (on an object store it would create a bucket)."""
    pytest.importorskip("fsspec")
    from unittest import mock

    from fabric_lite.utilities.cloud_io import _atomic_save

    fs = mock.MagicMock()
    monkeypatch.setattr("fsspec.core.url_to_fs", lambda url, **kwargs: (fs, "bucket/run/last.ckpt"))
    _atomic_save({"w": torch.arange(3)}, "s3://bucket/run/last.ckpt")
    fs.pipe.assert_called_once()
    path, data = fs.pipe.call_args.args
    assert path == "bucket/run/last.ckpt" and torch.load(io.BytesIO(data), weights_only=True)["w"].tolist() == [0, 1, 2]
    fs.open.assert_not_called()
    fs.makedirs.assert_not_called()


# ---------------------------------------------------------------------------------------------------- data
def test_attribute_dict() -> None:
    state = data.AttributeDict(model="m", step=0)
    state.step += 1
    state.lr = 0.5
    assert state == {"model": "m", "step": 1, "lr": 0.5}
    del state.lr
    assert "lr" not in state
    with pytest.raises(AttributeError, match="'AttributeDict' object has no attribute 'nope'"):
        _ = state.nope
    with pytest.raises(KeyError):
        del state.nope
    assert repr(state) == '"model": m\n"step":  1'
    assert repr(data.AttributeDict()) == ""


def test_suggested_max_num_workers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(16)), raising=False)
    assert [data.suggested_max_num_workers(n) for n in (1, 2, 3, 8, 16, 32)] == [15, 7, 4, 1, 1, 1]
    with pytest.raises(ValueError, match="`local_world_size` should be >= 1, got 0"):
        data.suggested_max_num_workers(0)
    monkeypatch.delattr(os, "sched_getaffinity")
    monkeypatch.setattr(os, "cpu_count", lambda: None)
    assert data.suggested_max_num_workers(1) == 1


class _Stream(IterableDataset[int]):
    def __iter__(self) -> Iterator[int]:
        return iter(range(3))


class _SizedStream(_Stream):
    def __len__(self) -> int:
        return 3


def test_lengths(rank: Any) -> None:
    assert data.sized_len([1, 2]) == 2 and data.sized_len(iter([1])) is None
    assert data.has_len(DataLoader(range(4))) and not data.has_len(DataLoader(_Stream()))
    with pytest.warns(UserWarning, match="returned 0 length"):
        assert data.has_len([])
    with pytest.warns(UserWarning, match="`IterableDataset` has `__len__` defined"):
        assert data.has_len(DataLoader(_SizedStream()))
    assert data.has_iterable_dataset(DataLoader(_Stream())) and not data.has_iterable_dataset([1])


def test_get_all_subclasses() -> None:
    class A: ...

    class B(A): ...

    class C(B): ...

    class D(C, B): ...  # reachable twice, through B and through C

    assert data.get_all_subclasses(A) == {B, C, D} and data.get_all_subclasses(C) == {D}


# ---------------------------------------------------------------------------------------------------- seed
def test_reset_seed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(seed.ENV_SEED, raising=False)
    monkeypatch.delenv(seed.ENV_SEED_WORKERS, raising=False)
    torch.manual_seed(5)
    seed.reset_seed()  # never seeded: nothing happens
    assert torch.initial_seed() == 5
    seed.seed_everything(123, workers=True)
    first = (torch.rand(2).tolist(), random.random(), np.random.rand())
    seed.reset_seed()
    assert (torch.rand(2).tolist(), random.random(), np.random.rand()) == first
    assert os.environ[seed.ENV_SEED_WORKERS] == "1"
    assert (seed.min_seed_value, seed.max_seed_value) == (0, 2**32 - 1)


def test_seed_everything_warns_without_a_seed(monkeypatch: pytest.MonkeyPatch, rank: Any) -> None:
    monkeypatch.delenv(seed.ENV_SEED, raising=False)
    with pytest.warns(UserWarning, match="No seed found, seed set to 0"):
        assert seed.seed_everything() == 0


def test_pl_worker_init_function_is_deterministic_and_distinct(rank: Any) -> None:
    def draws(base: int, worker_id: int, rank_: int | None) -> list[Any]:
        torch.manual_seed(base + worker_id)  # what torch does in worker ``worker_id``
        seed.pl_worker_init_function(worker_id, rank_)
        return [torch.rand(2).tolist(), random.random(), np.random.rand(2).tolist()]

    assert draws(42, 1, 0) == draws(42, 1, 0)
    distinct = [draws(42, 0, 0), draws(42, 1, 0), draws(42, 0, 1), draws(43, 0, 0)]
    assert all(a[i] != b[i] for a in distinct for b in distinct if a is not b for i in range(3))
    rank(1)
    assert draws(42, 0, None) == draws(42, 0, 1)  # the rank defaults to rank_zero_only.rank


# ---------------------------------------------------------------------------------------------------- apply_func
def test_convert_tensors_to_scalars() -> None:
    out = apply_func.convert_tensors_to_scalars({"a": torch.tensor(1.5), "b": [torch.tensor([2])], "c": "x"})
    assert out == {"a": 1.5, "b": [2], "c": "x"} and type(out["b"][0]) is int
    with pytest.raises(ValueError, match="does not contain a single element"):
        apply_func.convert_tensors_to_scalars([torch.ones(2)])


def test_conversion_dtypes_and_device_arguments() -> None:
    converted = {t: fn(v, device="cpu") for (t, fn), v in zip(apply_func.CONVERSION_DTYPES, [True, 3, 0.5, np.ones(2)])}
    assert [c.dtype for c in converted.values()] == [torch.uint8, torch.int32, torch.float32, torch.float64]
    assert apply_func.convert_to_tensors({"n": 1}, "cpu")["n"].dtype == torch.int32
    assert apply_func.move_data_to_device([torch.ones(1)], torch.device("cpu"))[0].device.type == "cpu"


# ---------------------------------------------------------------------------------------------------- types
def test_protocols() -> None:
    optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)
    assert isinstance(optimizer, types.Optimizable) and isinstance(optimizer, types.Steppable)
    assert not isinstance(object(), types.Steppable)

    class Group:
        def size(self) -> int:
            return 2

        def rank(self) -> int:
            return 0

    assert isinstance(Group(), types.CollectibleGroup) and not isinstance(optimizer, types.CollectibleGroup)
    assert types.RedOpType is torch.distributed.ReduceOp.RedOpType
    assert types.ProcessGroup is torch.distributed.ProcessGroup


# ---------------------------------------------------------------------------------------------------- distributed
class _Reversed(Sampler[int]):
    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.n - 1, -1, -1))

    def __len__(self) -> int:
        return self.n


def test_distributed_sampler_wrapper_shares() -> None:
    shares = [list(DistributedSamplerWrapper(_Reversed(9), num_replicas=3, rank=r, shuffle=False)) for r in range(3)]
    assert shares == [[8, 5, 2], [7, 4, 1], [6, 3, 0]]
    shuffled = [list(DistributedSamplerWrapper(_Reversed(9), num_replicas=3, rank=r, seed=1)) for r in range(3)]
    assert sorted(i for share in shuffled for i in share) == list(range(9)) and shuffled != shares
    again = [list(DistributedSamplerWrapper(_Reversed(9), num_replicas=3, rank=r, seed=1)) for r in range(3)]
    assert again == shuffled  # the shuffle depends on seed + epoch only


def test_distributed_sampler_wrapper_rejects_unsized_samplers() -> None:
    class Endless(Sampler[int]):
        def __iter__(self) -> Iterator[int]:
            return iter([])

        def __len__(self) -> int:
            return float("inf")  # type: ignore[return-value]

    with pytest.raises(TypeError, match=r"You seem to have configured a sampler in your DataLoader: \w+ has no __len"):
        DistributedSamplerWrapper(iter([1, 2]), num_replicas=1, rank=0)  # type: ignore[arg-type]
    with pytest.raises((TypeError, OverflowError)):
        DistributedSamplerWrapper(Endless(), num_replicas=1, rank=0)


def test_is_shared_filesystem_on_one_process(tmp_path: Path) -> None:
    strategy = Fabric(accelerator="cpu", devices=1).strategy
    assert is_shared_filesystem(strategy) is True
    assert is_shared_filesystem(strategy, tmp_path) is True
    assert is_shared_filesystem(strategy, "s3://bucket/path") is True
    assert list(tmp_path.iterdir()) == []  # nothing written with one process


# ---------------------------------------------------------------------------------------------------- accelerators
def test_accelerator_registry_holds_the_built_in_accelerators() -> None:
    assert ACCELERATOR_REGISTRY.available_accelerators() == {"cpu", "cuda", "mps", "tpu"}  # tpu: never available
    assert ACCELERATOR_REGISTRY["cpu"] == {
        "description": "CPUAccelerator",
        "init_params": {},
        "accelerator": CPUAccelerator,
        "accelerator_name": "cpu",
    }
    assert isinstance(ACCELERATOR_REGISTRY.get("cpu"), CPUAccelerator)
    assert {name: ACCELERATOR_REGISTRY[name]["accelerator"] for name in ACCELERATORS} == ACCELERATORS
    assert str(ACCELERATOR_REGISTRY).startswith("Registered Accelerators: ")


def test_accelerator_registry_register_get_remove() -> None:
    registry = _AcceleratorRegistry()

    class Custom(CPUAccelerator):
        def __init__(self, cores: int = 1) -> None:
            self.cores = cores

    returned = registry.register("custom", Custom, description="mine", cores=4)
    assert returned is Custom and registry.get("custom").cores == 4

    @registry.register("decorated", cores=2)
    class Decorated(Custom): ...

    assert isinstance(registry.get("decorated"), Decorated) and registry.get("decorated").cores == 2
    with pytest.raises(MisconfigurationException, match="'custom' is already present in the registry"):
        registry.register("custom", Custom)
    registry.register("custom", Decorated, override=True)
    assert isinstance(registry.get("custom"), Decorated)
    with pytest.raises(TypeError, match="`name` must be a str"):
        registry.register(3, Custom)  # type: ignore[arg-type]
    fallback = CPUAccelerator()
    assert registry.get("missing", fallback) is fallback
    with pytest.raises(KeyError, match="'missing' not found in registry"):
        registry.get("missing")
    registry.remove("decorated")
    assert registry.available_accelerators() == {"custom"}
    assert str(registry) == "Registered Accelerators: custom"


def test_register_accelerators_classmethod() -> None:
    registry = _AcceleratorRegistry()
    CPUAccelerator.register_accelerators(registry)
    Accelerator.register_accelerators(registry)  # the base class registers nothing
    assert registry.available_accelerators() == {"cpu"}


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the behaviour without a CUDA device")
def test_find_usable_cuda_devices_without_cuda() -> None:
    assert find_usable_cuda_devices(0) == []
    with pytest.raises(ValueError, match="You requested to find 2 devices but there are no visible CUDA devices"):
        find_usable_cuda_devices(2)
    with pytest.raises(ValueError, match="find -1 devices"):
        find_usable_cuda_devices()


# ---------------------------------------------------------------------------------------------------- exports
def test_utilities_exports_lightnings_names() -> None:
    lightning_all = {
        "disable_possible_user_warnings",
        "is_shared_filesystem",
        "LightningEnum",
        "measure_flops",
        "move_data_to_device",
        "rank_zero_deprecation",
        "rank_zero_info",
        "rank_zero_only",
        "rank_zero_warn",
        "suggested_max_num_workers",
        "AttributeDict",
        "Throughput",
        "ThroughputMonitor",
    }
    assert lightning_all <= set(utilities.__all__)
    assert utilities.rank_zero_only is rank_zero.rank_zero_only and utilities.Throughput is Throughput
    assert utilities.measure_flops is measure_flops and utilities.AttributeDict is data.AttributeDict


# ------------------------------------------------------------------------------------- Lightning's private helpers
def test_is_path_in_lightning_is_lightnings_naive_check(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from fabric_lite.utilities.warnings import _is_path_in_lightning

    monkeypatch.chdir(tmp_path)
    assert _is_path_in_lightning(Path("/a/b/c/lightning/core/lightning.py"))
    assert _is_path_in_lightning(Path("/a/b/lightning"))
    assert not _is_path_in_lightning(Path("/a/b/c/"))


def test_has_meta_device_parameters_or_buffers_names_what_it_takes() -> None:
    from fabric_lite.utilities.init import _has_meta_device_parameters_or_buffers

    with pytest.raises(TypeError, match=r"Expected `torch.nn.Module` or `torch.optim.Optimizer`, got NoneType"):
        _has_meta_device_parameters_or_buffers(None)  # type: ignore[arg-type]
