"""Observations of the Lightning-named utilities, printed as one JSON line, for tests/compat/test_utilities_compat.py.

Run with ``COMPAT_IMPL=lightning`` under the Lightning venv (imports ``lightning_fabric``) or
``COMPAT_IMPL=fabric_lite`` (imports ``fabric_lite``); the test compares the two outputs. Every input is fixed, so
the outputs are deterministic.
"""

from __future__ import annotations

import importlib
import json
import os
import random
import warnings
from typing import Any

import numpy as np
import torch
from torch.utils.data import Sampler

IMPL = os.environ["COMPAT_IMPL"]
PKG = "lightning_fabric" if IMPL == "lightning" else "fabric_lite"


def mod(name: str) -> Any:
    return importlib.import_module(f"{PKG}.utilities.{name}")


def throughput_cases() -> dict[str, Any]:
    Throughput = mod("throughput").Throughput
    out: dict[str, Any] = {}
    # (constructor kwargs, sequence of update kwargs)
    cases = {
        "plain": (
            {"window_size": 3},
            [{"time": t, "batches": b, "samples": 4 * b} for t, b in [(1.0, 1), (2.5, 2), (3.0, 4), (7.0, 5)]],
        ),
        "global_lengths_flops": (
            {"window_size": 2, "world_size": 3, "available_flops": 50.0},
            [
                {"time": 1.0, "batches": 1, "samples": 2, "lengths": 10, "flops": 7},
                {"time": 2.0, "batches": 2, "samples": 4, "lengths": 30, "flops": 9},
                {"time": 4.0, "batches": 3, "samples": 6, "lengths": 35, "flops": 11},
            ],
        ),
        "separator": (
            {"window_size": 2, "separator": "|", "world_size": 2},
            [{"time": 1, "batches": 1, "samples": 1}, {"time": 3, "batches": 5, "samples": 9}],
        ),
        "short_window": ({"window_size": 5}, [{"time": 1.0, "batches": 1, "samples": 1}]),
    }
    for name, (init, updates) in cases.items():
        tp = Throughput(**init)
        computed = []
        for update in updates:
            tp.update(**update)
            computed.append(tp.compute())
        out[name] = computed
    errors = {}
    bad_updates = {
        "samples_lt_batches": [{"time": 1.0, "batches": 2, "samples": 1}],
        "lengths_lt_samples": [{"time": 1.0, "batches": 1, "samples": 3, "lengths": 2}],
        "not_increasing": [{"time": 1.0, "batches": 1, "samples": 1}, {"time": 1.0, "batches": 2, "samples": 2}],
        "lengths_later": [
            {"time": 1.0, "batches": 1, "samples": 1},
            {"time": 2.0, "batches": 2, "samples": 2, "lengths": 3},
        ],
    }
    for name, updates in bad_updates.items():
        tp = Throughput(window_size=4)
        try:
            for update in updates:
                tp.update(**update)
            errors[name] = None
        except Exception as err:
            errors[name] = [type(err).__name__, str(err)]
    out["errors"] = errors
    return out


def measure_flops_cases() -> dict[str, Any]:
    measure_flops = mod("throughput").measure_flops
    torch.manual_seed(0)
    with torch.device("meta"):
        model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
        x = torch.randn(8, 32)
    cpu_model = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.Tanh(), torch.nn.Linear(7, 3))
    y = torch.randn(4, 5)
    return {
        "meta_forward": measure_flops(model, lambda: model(x)),
        "meta_train": measure_flops(model, lambda: model(x), lambda out: out.sum()),
        "cpu_train": measure_flops(cpu_model, lambda: cpu_model(y), lambda out: out.pow(2).mean()),
    }


GPU_NAMES = [
    "NVIDIA A100-SXM4-80GB",
    "NVIDIA A100 80GB PCIe",
    "NVIDIA H100 80GB HBM3",
    "NVIDIA H100 NVL",
    "NVIDIA H100 PCIe",
    "NVIDIA H200 SXM1",
    "NVIDIA H200",
    "NVIDIA L4",
    "NVIDIA L40S",
    "Tesla T4",
    "NVIDIA GeForce RTX 4090",
    "NVIDIA GeForce RTX 4080 SUPER",
    "NVIDIA GeForce RTX 3080 Ti",
    "NVIDIA GeForce RTX 2070 SUPER",
    "NVIDIA RTX A6000",
    "NVIDIA A10G",
    "NVIDIA A40",
    "Quadro RTX 5000",
    "NVIDIA TITAN RTX",
    "Tesla V100-SXM2-16GB",
    "Tesla V100-PCIE-32GB",
    "Tesla V100S-PCIE-32GB",
    "Some Future GPU",
]
DTYPES = [torch.float64, torch.float32, torch.bfloat16, torch.float16, torch.int8, "int4"]


def available_flops_cases() -> dict[str, Any]:
    """get_available_flops for known GPU names, with torch.cuda's name and capability queries answered by us."""
    throughput = mod("throughput")
    state = {"name": "", "major": 8}
    torch.cuda.get_device_name = lambda device=None: state["name"]  # type: ignore[assignment]
    torch.cuda.get_device_capability = lambda device=None: (state["major"], 0)  # type: ignore[assignment]
    if IMPL == "lightning":
        import lightning_fabric.accelerators.cuda as lcuda

        lcuda._is_ampere_or_later = lambda device=None: state["major"] >= 8  # type: ignore[assignment]
    out: dict[str, Any] = {}
    for name in GPU_NAMES:
        for major, matmul in ((7, "high"), (8, "highest"), (8, "high")):
            state["name"], state["major"] = name, major
            torch.set_float32_matmul_precision(matmul)
            for dtype in DTYPES:
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always")
                    value = throughput.get_available_flops(torch.device("cuda", 0), dtype)
                out[f"{name}|{major}|{matmul}|{dtype}"] = [value, [str(w.message) for w in caught]]
    torch.set_float32_matmul_precision("highest")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out["cpu"] = [throughput.get_available_flops(torch.device("cpu"), torch.float32), len(caught)]
    return out


def worker_seed_cases() -> dict[str, Any]:
    pl_worker_init_function = mod("seed").pl_worker_init_function
    out = {}
    for base, worker_id, rank in [(42, 0, 0), (42, 1, 0), (42, 0, 1), (12345678901, 3, 2), (7, 2, None)]:
        torch.manual_seed(base + worker_id)  # what torch does in a dataloader worker
        if rank is None:
            mod("rank_zero").rank_zero_only.rank = 5
        pl_worker_init_function(worker_id, rank)
        out[f"{base}-{worker_id}-{rank}"] = [torch.rand(3).tolist(), random.random(), np.random.rand(3).tolist()]
    return out


class _Reversed(Sampler[int]):
    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(range(self.n - 1, -1, -1))

    def __len__(self) -> int:
        return self.n


def sampler_wrapper_cases() -> dict[str, Any]:
    DistributedSamplerWrapper = mod("distributed").DistributedSamplerWrapper
    out = {}
    for n, world in [(10, 2), (11, 3), (7, 4)]:
        for kwargs in [{}, {"shuffle": False}, {"seed": 3}, {"drop_last": True}]:
            shares = []
            for rank in range(world):
                wrapper = DistributedSamplerWrapper(_Reversed(n), num_replicas=world, rank=rank, **kwargs)
                epochs = [list(wrapper)]
                wrapper.set_epoch(1)
                epochs.append(list(wrapper))
                shares.append(epochs)
            out[f"{n}-{world}-{sorted(kwargs.items())}"] = shares
    return out


def misc_cases() -> dict[str, Any]:
    data = mod("data")
    enums = mod("enums")
    rank_zero = mod("rank_zero")
    apply_func = mod("apply_func")

    class Mode(enums.LightningEnum):  # type: ignore[misc,name-defined]
        TRAIN = "Train"
        EVAL = "eval-mode"

    def outcome(fn: Any) -> Any:
        try:
            value = fn()
            return ["ok", repr(value)]
        except Exception as err:
            return [type(err).__name__, str(err)]

    state = data.AttributeDict(zeta=1, alpha=[1, 2], longer_key="x")
    return {
        "attrdict_repr": repr(state),
        "attrdict_empty": repr(data.AttributeDict()),
        "attrdict_missing": outcome(lambda: state.nope),
        "enum_eq": [Mode.TRAIN == "train", Mode.TRAIN == "TRAIN", Mode.EVAL == "EVAL-MODE", Mode.TRAIN == Mode.EVAL],
        "enum_hash": [hash(Mode.TRAIN) == hash("train"), len({Mode.TRAIN, "train"})],
        "enum_from_str": [
            outcome(lambda: Mode.from_str("train")),
            outcome(lambda: Mode.from_str("EVAL-MODE", source="value")),
            outcome(lambda: Mode.from_str("eval", source="any")),
            outcome(lambda: Mode.from_str("nope", source="any")),
            outcome(lambda: Mode.from_str("Train", source="value")),
        ],
        "prefixed": [rank_zero.rank_prefixed_message("hi", 3), rank_zero.rank_prefixed_message("hi", None)],
        "scalars": outcome(
            lambda: apply_func.convert_tensors_to_scalars({"a": torch.tensor(1.5), "b": [torch.tensor(2)]})
        ),
        "scalars_error": outcome(lambda: apply_func.convert_tensors_to_scalars(torch.ones(2))),
        "workers": [outcome(lambda: data.suggested_max_num_workers(k)) for k in (1, 2, 3, 64, 0)],
        "sized_len": [data.sized_len([1, 2]), data.sized_len(iter([1]))],
        "seed_bounds": [mod("seed").min_seed_value, mod("seed").max_seed_value],
    }


if __name__ == "__main__":
    result = {
        "throughput": throughput_cases(),
        "measure_flops": measure_flops_cases(),
        "available_flops": available_flops_cases(),
        "worker_seed": worker_seed_cases(),
        "sampler_wrapper": sampler_wrapper_cases(),
        "misc": misc_cases(),
    }
    print("RESULT " + json.dumps(result, sort_keys=True))
