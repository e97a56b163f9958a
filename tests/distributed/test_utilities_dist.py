"""The Lightning-named utilities on two real gloo ranks: ``rank_zero_only`` set by the launch,
``DistributedSamplerWrapper``, ``is_shared_filesystem``, ``SpikeDetection`` and ``ThroughputMonitor``.

One job (``observe``, at the end of this module) runs every check on both ranks; each test below checks one of
them against values computed here from the same rank-dependent inputs.
"""

from __future__ import annotations

import json
import os
import traceback
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DistributedSampler, Sampler

from tests.helpers.harness import per_rank, spawn_job

pytestmark = pytest.mark.distributed


@pytest.fixture(scope="module")
def job_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("utilities_job")


@pytest.fixture(scope="module")
def two_ranks(job_dir: Path) -> list[dict[str, Any]]:
    return spawn_job("tests.distributed.test_utilities_dist:observe", 2, timeout=120, tmp=str(job_dir))


def test_launch_sets_rank_zero_only_rank(two_ranks: list[dict[str, Any]]) -> None:
    r0, r1 = per_rank(two_ranks, "rank_zero")
    assert (r0["rank_zero_only.rank"], r0["global_rank"], r0["decorated"]) == (0, 0, "ran")
    assert (r1["rank_zero_only.rank"], r1["global_rank"], r1["decorated"]) == (1, 1, "skipped")
    assert r0["warnings"] == ["from rank 0"] and r1["warnings"] == []


def test_sampler_wrapper_splits_the_inner_sampler(two_ranks: list[dict[str, Any]]) -> None:
    results = per_rank(two_ranks, "sampler")
    n = N_INDICES
    for epoch in (0, 1):
        order = torch.randperm(n, generator=torch.Generator().manual_seed(100 + epoch)).tolist()
        positions = [*range(n), 0]  # padded to an even total, as DistributedSampler does
        shares = [r["shares"][epoch] for r in results]
        assert shares == [[order[p] for p in positions[rank::2]] for rank in range(2)]
        assert set(shares[0]) | set(shares[1]) == set(range(n))
        assert len(set(shares[0]) & set(shares[1])) == 1  # only the padding index repeats
    for rank, r in enumerate(results):
        assert (r["num_replicas"], r["rank"]) == (2, rank)  # from the process group
        assert r["inner_epochs"] == [1]  # set_epoch reached the wrapped sampler


def test_sampler_wrapper_shuffles_positions_like_distributed_sampler(two_ranks: list[dict[str, Any]]) -> None:
    results = per_rank(two_ranks, "sampler")
    order = torch.randperm(N_INDICES, generator=torch.Generator().manual_seed(100)).tolist()
    for rank, r in enumerate(results):
        positions = list(DistributedSampler(range(N_INDICES), num_replicas=2, rank=rank, seed=7))
        assert r["shuffled"] == [order[p] for p in positions]


def test_is_shared_filesystem_on_one_machine(two_ranks: list[dict[str, Any]]) -> None:
    for r in per_rank(two_ranks, "shared_fs"):
        assert r["common"] is True and r["file"] is True and r["url"] is True
        assert r["per_rank_paths"] is False  # each rank asked about its own folder
        assert r["missing"] is not None and "does not exist" in r["missing"]
        assert r["leftovers"] == ["file.txt"]  # the marker file is gone


def test_spike_on_one_rank_stops_every_rank(two_ranks: list[dict[str, Any]], job_dir: Path) -> None:
    r0, r1 = (r["spike"] for r in per_rank(two_ranks, "spike"))
    for r in (r0, r1):
        assert r["seen"] == [0, 1, 2, 3] and r["raised"] == "Training spike detected in batch 4"
        assert r["bad_batches"] == [3, 4]
    assert json.loads((job_dir / "spikes" / "skip_batches.json").read_text()) == [3, 4]
    # each rank's running mean holds its own last 3 losses (batches 1, 2, 3)
    for r in (r0, r1):
        assert [s for s, _ in r["state"]["running"]] == pytest.approx([1.9, 1.8, 1.7])
        assert [n for _, n in r["state"]["running"]] == [1, 1, 1]


def test_no_spike_runs_through_and_writes_nothing(two_ranks: list[dict[str, Any]], job_dir: Path) -> None:
    for r in per_rank(two_ranks, "spike"):
        assert r["calm"]["seen"] == [0, 1, 2, 3] and r["calm"]["raised"] is None
    assert not (job_dir / "calm").exists()


def test_non_finite_loss_on_one_rank_is_left_out_everywhere(two_ranks: list[dict[str, Any]]) -> None:
    r0, r1 = (r["nan"] for r in per_rank(two_ranks, "spike"))
    assert r0["raised"] is None and r1["raised"] is None
    # batch 2 is left out of both ranks' means, because rank 1's loss was NaN there
    assert [s for s, _ in r0["state"]["running"]] == [1.0, 1.0, 1.0]
    assert [s for s, _ in r1["state"]["running"]] == [3.0, 3.0, 3.0]


def test_throughput_monitor_computes_on_rank_zero_only(two_ranks: list[dict[str, Any]]) -> None:
    r0, r1 = per_rank(two_ranks, "throughput")
    expected = {
        "time": 3.0,
        "batches": 3,
        "samples": 12,
        "device/batches_per_sec": 1.0,  # (3 - 1) batches in (3 - 1) s, rank 0's numbers
        "device/samples_per_sec": 4.0,
        "batches_per_sec": 2.0,  # times the world size
        "samples_per_sec": 8.0,
    }
    assert r0["computed"] == expected and r0["logged"] == expected and r0["step"] == 0
    assert r1["computed"] == {} and r1["logged"] == {} and r1["step"] == -1


# ------------------------------------------------- the job: run on every rank by tests/helpers/jobs/_runner.py

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
