"""DeepSpeed's precision plugin, and pointing DeepSpeed at this process and its process group."""

from __future__ import annotations

import importlib
import os
from datetime import timedelta
from typing import Any

import torch

from fabric_lite.plugins.precision import HalfPrecision, MixedPrecision, Precision
from fabric_lite.plugins.precision.deepspeed import DEEPSPEED_PRECISIONS, DeepSpeedPrecision


def deepspeed_precision(precision: Precision | None) -> DeepSpeedPrecision | None:
    """The precision as DeepSpeed's: a built-in plugin becomes a :class:`DeepSpeedPrecision` of the same name;
    another plugin, which cannot drive DeepSpeed's engine, raises ``TypeError``."""
    if precision is None or isinstance(precision, DeepSpeedPrecision):
        return precision
    if type(precision) in (Precision, MixedPrecision, HalfPrecision):
        return DeepSpeedPrecision(precision.precision)  # type: ignore[arg-type]
    raise TypeError(
        f"DeepSpeedStrategy cannot run the precision plugin {type(precision).__name__}(precision="
        f"{precision.precision!r}): DeepSpeed's engine casts the model and runs the backward itself. Pass"
        f" Fabric(precision=...) with one of {', '.join(map(repr, DEEPSPEED_PRECISIONS))}, or"
        " plugins=[DeepSpeedPrecision(...)]."
    )


def join_process_group(
    deepspeed: Any,
    *,
    device: torch.device,
    ranks: tuple[int, int, int],
    main_address: str,
    main_port: int,
    backend: str,
    timeout: timedelta,
) -> None:
    """Point DeepSpeed at this process, whose process group exists already: its accelerator, the variables it
    reads, and its communication layer, which then wraps that group. ``ranks``: (global, local, world size).

    Raises:
        RuntimeError: a CUDA device whose index is not the local rank, or DeepSpeed set to another accelerator.
    """
    global_rank, local_rank, world_size = ranks
    if device.type == "cuda" and device.index != local_rank:
        # DeepSpeed places ZeRO-3 parameters on cuda:$LOCAL_RANK, whatever the device given to it
        raise RuntimeError(
            f"DeepSpeedStrategy runs local rank {local_rank} on {device}, but DeepSpeed expects cuda:{local_rank}:"
            " the device indices must equal the local ranks. To use other GPUs, select them with"
            " CUDA_VISIBLE_DEVICES (e.g. CUDA_VISIBLE_DEVICES=2,3 with devices=2)."
        )
    accelerators = importlib.import_module("deepspeed.accelerator")
    selected = accelerators.get_accelerator().device_name()
    if device.type == "cpu" and selected != "cpu":
        # what DS_ACCELERATOR=cpu would have chosen; DeepSpeed picks CUDA by itself wherever it finds it
        cpu = importlib.import_module("deepspeed.accelerator.cpu_accelerator")
        accelerators.set_accelerator(cpu.CPU_Accelerator())
    elif device.type != "cpu" and selected != device.type:
        raise RuntimeError(
            f"DeepSpeed uses its {selected!r} accelerator, but this process computes on {device}. Unset"
            f" DS_ACCELERATOR (now {os.environ.get('DS_ACCELERATOR')!r}), or choose Fabric(accelerator={selected!r})."
        )
    if device.type == "cpu" and not deepspeed.comm.is_initialized():
        _skip_shared_memory_extension(deepspeed)
    # DeepSpeed reads these long after initialisation (ZeRO-3 places parameters on LOCAL_RANK's device); a later
    # Fabric(...) in this process therefore joins this job, as under torchrun
    os.environ["MASTER_ADDR"] = main_address
    os.environ["MASTER_PORT"] = str(main_port)
    os.environ["RANK"] = str(global_rank)
    os.environ["WORLD_SIZE"] = str(world_size)
    os.environ["LOCAL_RANK"] = str(local_rank)
    deepspeed.init_distributed(
        dist_backend=backend, auto_mpi_discovery=False, timeout=timeout, dist_init_required=False
    )


def _skip_shared_memory_extension(deepspeed: Any) -> None:
    """Mark DeepSpeed's shared-memory all-reduce extension unavailable unless it was installed built: on the CPU
    its communication layer would compile it at start, for an inference all-reduce training never calls."""
    if not importlib.import_module("deepspeed.git_version_info").installed_ops.get("deepspeed_shm_comm", False):
        deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
