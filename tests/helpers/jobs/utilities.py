"""The Lightning-named utilities on real ranks (run by tests/distributed/test_utilities_dist.py through ``spawn_job``).

:func:`observe` runs every check and returns, per check, plain observations or the traceback of the failure, so one
broken check does not hide the others; every rank runs the same checks in the same order (most are collectives).
The inputs depend on the rank, so the test computes every expected value exactly.
"""

from __future__ import annotations

import os
import traceback
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Sampler

N_INDICES = 11  # odd: DistributedSampler pads the shares of 2 ranks to 6 each

# rank 1 spikes at batch 4 only; rank 0 decreases steadily
SPIKE_LOSSES = {0: [2.0, 1.9, 1.8, 1.7, 1.6, 1.5], 1: [2.0, 1.9, 1.8, 1.7, 9.0, 1.5]}
CALM_LOSSES = {0: [1.0, 0.9, 0.8, 0.7], 1: [2.0, 1.8, 1.6, 1.4]}
# finite_only=False: rank 1's loss is NaN at batch 2, which is no spike, and no rank adds batch 2 to its mean
NAN_LOSSES = {0: [1.0, 1.0, 1.0, 1.0], 1: [3.0, 3.0, float("nan"), 3.0]}


class EpochPermutation(Sampler[int]):
    """A sampler of its own: a permutation of ``range(n)`` seeded by the epoch it was given."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.epochs: list[int] = []
        self.epoch = 0

    def __iter__(self) -> Iterator[int]:
        return iter(torch.randperm(self.n, generator=torch.Generator().manual_seed(100 + self.epoch)).tolist())

    def __len__(self) -> int:
        return self.n

    def set_epoch(self, epoch: int) -> None:
        self.epochs.append(epoch)
        self.epoch = epoch


def _check(fn: Callable[[], Any]) -> Any:
    try:
        return fn()
    except Exception:
        return {"traceback": traceback.format_exc()}


def _rank_zero(fabric: Any) -> dict[str, Any]:
    from fabric_lite.utilities.rank_zero import rank_zero_only, rank_zero_warn

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        rank_zero_warn(f"from rank {fabric.global_rank}")
    return {
        "rank_zero_only.rank": rank_zero_only.rank,
        "global_rank": fabric.global_rank,
        "decorated": rank_zero_only(lambda: "ran", default="skipped")(),
        "warnings": [str(w.message) for w in caught],
    }


def _sampler(fabric: Any) -> dict[str, Any]:
    from fabric_lite.utilities.distributed import DistributedSamplerWrapper

    inner = EpochPermutation(N_INDICES)
    # num_replicas and rank come from the process group, as with DistributedSampler
    wrapper = DistributedSamplerWrapper(inner, shuffle=False)
    shares = [list(wrapper)]
    wrapper.set_epoch(1)
    shares.append(list(wrapper))
    shuffled = DistributedSamplerWrapper(EpochPermutation(N_INDICES), seed=7)
    return {
        "shares": shares,
        "inner_epochs": inner.epochs,
        "num_replicas": wrapper.num_replicas,
        "rank": wrapper.rank,
        "shuffled": list(shuffled),
    }


def _shared_fs(fabric: Any, tmp: str) -> dict[str, Any]:
    from fabric_lite.utilities.distributed import is_shared_filesystem

    strategy = fabric.strategy
    common = Path(tmp) / "common"
    common.mkdir(exist_ok=True)
    own = Path(tmp) / f"rank{fabric.global_rank}"
    own.mkdir(exist_ok=True)
    a_file = common / "file.txt"
    if fabric.global_rank == 0:
        a_file.write_text("x")
    strategy.barrier()
    result = {
        "common": is_shared_filesystem(strategy, common, timeout=10),
        "file": is_shared_filesystem(strategy, a_file, timeout=10),
        "per_rank_paths": is_shared_filesystem(strategy, own, timeout=10),
        "url": is_shared_filesystem(strategy, "s3://bucket/x"),
    }
    try:
        is_shared_filesystem(strategy, Path(tmp) / "missing")
        result["missing"] = None
    except FileNotFoundError as err:
        result["missing"] = str(err)
    strategy.barrier()
    result["leftovers"] = sorted(p.name for p in common.iterdir())
    return result


def _run_spike(fabric: Any, losses: dict[int, list[float]], **kwargs: Any) -> dict[str, Any]:
    from fabric_lite.utilities.spike import SpikeDetection, TrainingSpikeException

    detector = SpikeDetection(**kwargs)
    seen = []
    try:
        for batch_idx, value in enumerate(losses[fabric.global_rank]):
            detector.on_train_batch_end(fabric, torch.tensor(value), None, batch_idx)
            seen.append(batch_idx)
        raised = None
    except TrainingSpikeException as err:
        raised = str(err)
    return {"seen": seen, "raised": raised, "bad_batches": detector.bad_batches, "state": detector.state_dict()}


def _spike(fabric: Any, tmp: str) -> dict[str, Any]:
    return {
        "spike": _run_spike(fabric, SPIKE_LOSSES, window=3, exclude_batches_path=os.path.join(tmp, "spikes")),
        "calm": _run_spike(fabric, CALM_LOSSES, window=3, exclude_batches_path=os.path.join(tmp, "calm")),
        "nan": _run_spike(
            fabric, NAN_LOSSES, window=10, finite_only=False, exclude_batches_path=os.path.join(tmp, "nan")
        ),
    }


def _throughput(fabric: Any) -> dict[str, Any]:
    from fabric_lite.utilities.throughput import ThroughputMonitor

    monitor = ThroughputMonitor(fabric, window_size=2)
    scale = fabric.global_rank + 1  # rank 1's numbers would give other rates: they must be ignored
    monitor.update(time=1.0 * scale, batches=1, samples=4)
    monitor.update(time=3.0 * scale, batches=3, samples=12)
    return {"computed": monitor.compute(), "logged": monitor.compute_and_log(), "step": monitor.step}


def observe(fabric: Any, tmp: str) -> dict[str, Any]:
    return {
        "rank_zero": _check(lambda: _rank_zero(fabric)),
        "sampler": _check(lambda: _sampler(fabric)),
        "shared_fs": _check(lambda: _shared_fs(fabric, tmp)),
        "spike": _check(lambda: _spike(fabric, tmp)),
        "throughput": _check(lambda: _throughput(fabric)),
    }
