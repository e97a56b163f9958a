"""CUDA paths (marked ``cuda``): run on a machine with a GPU, skipped with a reason elsewhere.

On a CUDA machine with torch installed, from a checkout: ``PYTHONPATH=$PWD python -m pytest -q -m cuda tests``.
Each check runs in its own process (tests/helpers/scripts/cuda_checks.py), so CUDA is never initialised in the test
process itself. One GPU cannot host two NCCL ranks, so NCCL is checked at world size 1.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import torch

from tests.helpers.harness import run_python

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (none on this machine)"),
]


def check(name: str) -> dict:
    done = run_python(["tests/helpers/scripts/cuda_checks.py", name], timeout=180)
    assert done.returncode == 0, done.output
    rows = [json.loads(line[7:]) for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert len(rows) == 1, done.output
    return rows[0]  # type: ignore[no-any-return]


def test_single_device_training_places_everything_on_the_gpu() -> None:
    r = check("single_device")
    assert r["device"] == "cuda:0"
    assert r["param_devices"] == ["cuda:0"] and r["state_devices"] == ["cuda:0"]
    assert r["batch_devices"] == ["cuda:0"]
    assert r["init_module"] == "cuda:0" and r["init_tensor"] == "cuda:0" and r["to_device"] == "cuda:0"
    assert r["loss_went_down"]


def test_double_precision_on_the_gpu() -> None:
    assert check("double_precision") == {"param": "torch.float64", "out": "torch.float32", "device": "cuda:0"}


def test_nccl_at_world_size_one() -> None:
    r = check("nccl_world_size_one")
    assert r["backend"] == "nccl" and r["world"] == 1 and r["strategy"] == "DDPStrategy"
    assert r["module"] == "DistributedDataParallel"
    assert r["reduced"] == [[1.0, 3.0], 3, "torch.int32", "cuda:0"]
    assert r["flags"] == [[True, False], "torch.bool"]  # bool travels as uint8 over NCCL and comes back as bool
    assert r["gathered"] == [[3], [0, 1, 2]]  # world size 1: no extra dimension, as Lightning documents
    assert r["broadcast"] == [[0, 1, 2, 3], "cuda:0", {"k": 1}]
    assert r["decision"] is True
    assert r["grad_device"] == "cuda:0"


def test_collectives_do_not_synchronise_the_device_at_world_size_one() -> None:
    r = check("collectives_without_sync_one_gpu")
    assert r == {"world": 1, "host_checks": True, "backend": "nccl", "reduced": [0.0, 1.0, 2.0, 3.0], "gathered": [4]}


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="NCCL needs two GPUs for two ranks (this machine has fewer)")
def test_collectives_do_not_synchronise_the_device_on_two_gpus() -> None:
    """all_reduce, all_gather and barrier under torch.cuda.set_sync_debug_mode("error"): the checks travel on a gloo
    group from host metadata, the data on NCCL, and nothing waits for the GPU."""
    r = check("collectives_without_sync_two_gpus")
    assert r == {
        "world": 2,
        "host_checks": True,
        "backend": "nccl",
        "reduced": [0.0, 2.0, 4.0, 6.0],
        "gathered": [2, 4],
    }


def test_checkpoints_move_between_gpu_and_cpu_with_cuda_rng_state() -> None:
    r = check("checkpoint_round_trip")
    assert r["same_on_cpu"] and r["same_on_gpu"] and r["rng_restored"]
    assert r["step"] == 1 and r["opt_state_device"] == ["cpu"]


def test_fork_after_cuda_initialisation_is_refused() -> None:
    """Refused where the forked workers would use CUDA; workers on the CPU never touch it, and are forked."""
    r = check("fork_after_cuda")
    assert r["raised"] == "RuntimeError" and "ddp_spawn" in r["message"]
    assert r["cpu_workers"] == 0  # rank 0's result


def test_auto_accelerator_and_every_gpu() -> None:
    r = check("auto_accelerator")
    assert r["accelerator"] == "CUDAAccelerator" and r["device"] == "cuda:0"
    assert r["all_devices"] == r["count"]


GPU_DTYPES = {
    # precision: (parameters, gradients, inside the forward, output)
    "32-true": ("torch.float32", "torch.float32", "torch.float32", "torch.float32"),
    "64-true": ("torch.float64", "torch.float64", "torch.float64", "torch.float32"),
    "16-mixed": ("torch.float32", "torch.float32", "torch.float16", "torch.float32"),
    "bf16-mixed": ("torch.float32", "torch.float32", "torch.bfloat16", "torch.float32"),
    "16-true": ("torch.float16", "torch.float16", "torch.float16", "torch.float32"),
    "bf16-true": ("torch.bfloat16", "torch.bfloat16", "torch.bfloat16", "torch.float32"),
}


def test_every_precision_on_one_gpu_single_device_and_nccl() -> None:
    results = check("every_precision")
    for strategy in ("single_device", "ddp"):
        for precision, expected in GPU_DTYPES.items():
            r = results[f"{strategy}/{precision}"]
            assert (r["param"], r["grad"], r["inner"], r["output"]) == expected, f"{strategy} {precision}"
            assert r["finite"] and r["scaler"] is (precision == "16-mixed"), f"{strategy} {precision}"


def test_16_mixed_scaler_on_cuda() -> None:
    assert check("scaler_on_cuda") == {"device": "cuda", "skipped": True, "halved": True, "restored": True}


def test_compiled_model_on_one_gpu_single_device_and_nccl() -> None:
    """Inductor on the GPU: the compiled model is set up uncompiled and compiled again around the strategy's module
    (DistributedDataParallel under DDP); losses equal to eager; no ``_orig_mod.`` in the state dict."""
    r = check("compiled_on_gpu")
    for strategy, inner in (("single_device", "Net"), ("ddp", "DistributedDataParallel")):
        assert not r[strategy]["eager_call_compiled"] and r[strategy]["compiled_call_compiled"], strategy
        assert r[strategy]["forward_module"] == inner
        assert r[strategy]["max_difference"] <= 1e-5, strategy
        assert r[strategy]["keys"] == ["fc1.bias", "fc1.weight", "fc2.bias", "fc2.weight"]


def test_fsdp_on_one_gpu_trains_and_round_trips_a_sharded_checkpoint() -> None:
    r = check("fsdp_on_gpu")
    for precision in ("32-true", "bf16-mixed"):
        assert r[precision] == {
            "param_devices": ["cuda:0"],
            "loss_went_down": True,
            "is_folder": True,
            "same_after_load": True,
            "remainder": {"step": 20},
            "output": "torch.float32",
        }, precision


def test_tensor_parallel_example_on_one_gpu_resumes_with_the_same_losses(tmp_path: Path) -> None:
    """examples/tensor_parallel.py on a 1 x 1 mesh over NCCL: ModelParallelStrategy, DTensor parameters and
    loss_parallel on the GPU, a sharded checkpoint and a resume that retraces the losses."""
    flags = ["--accelerator", "cuda", "--devices", "1", "--data-parallel-size", "1", "--tensor-parallel-size", "1"]
    flags += ["--steps", "12", "--save-every", "6", "--log-every", "3", "--checkpoint-dir", str(tmp_path / "ckpt")]
    pattern = re.compile(r"step +(\d+)  loss ([\d.]+)")
    first = run_python(["examples/tensor_parallel.py", *flags], timeout=300)
    assert first.returncode == 0, first.output
    losses = {int(m.group(1)): m.group(2) for m in pattern.finditer(first.stdout)}
    assert list(losses) == [3, 6, 9, 12] and float(losses[12]) < float(losses[3]), first.output
    shutil.rmtree(tmp_path / "ckpt" / "step-000012")
    second = run_python(["examples/tensor_parallel.py", *flags, "--resume"], timeout=300)
    assert second.returncode == 0, second.output
    resumed = {int(m.group(1)): m.group(2) for m in pattern.finditer(second.stdout)}
    assert resumed == {9: losses[9], 12: losses[12]}, second.output


def test_model_parallel_strategy_on_one_gpu_with_dtensor_parameters() -> None:
    r = check("model_parallel_on_gpu")
    assert r == {
        "mesh": [1, 1],
        "dtensors": True,
        "devices": ["cuda:0"],
        "loss_went_down": True,
        "finite_norm": True,
        "is_folder": True,
        "same_after_load": True,
        "remainder": {"step": 10},
        "same_next_loss": True,
    }


def test_pipeline_stages_on_one_gpu() -> None:
    """Two stages of the split model on one GPU under Interleaved1F1B over NCCL: the gradients of the whole batch
    (float32: to rounding; bf16 autocast: both sides compute in bfloat16, in another order), the parameters on the
    device; the peak memory per step for 1, 2, 4 and 8 micro-batches is printed for the record."""
    r = check("pipeline_stages_on_gpu")
    print("pipeline peak MB by micro-batches:", r["peak_mb"])
    fp32, bf16 = r["torch.float32"], r["torch.bfloat16"]
    assert fp32["devices"] == bf16["devices"] == ["cuda:0"]
    assert abs(fp32["loss"][0] - fp32["loss"][1]) < 1e-5 and fp32["grad_error"] < 1e-5, fp32
    assert abs(bf16["loss"][0] - bf16["loss"][1]) < 0.05 and bf16["grad_error"] < 0.05, bf16
    assert set(r["peak_mb"]) == {"1", "2", "4", "8"} and all(v > 0 for v in r["peak_mb"].values())
