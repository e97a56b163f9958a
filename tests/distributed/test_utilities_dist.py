"""The Lightning-named utilities on two real gloo ranks: ``rank_zero_only`` set by the launch,
``DistributedSamplerWrapper``, ``is_shared_filesystem``, ``SpikeDetection`` and ``ThroughputMonitor``.

One job (tests/helpers/jobs/utilities.py) runs every check on both ranks; each test below checks one of them against
values computed here from the same rank-dependent inputs.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DistributedSampler

from tests.helpers.harness import per_rank, spawn_job
from tests.helpers.jobs import utilities as jobs

pytestmark = pytest.mark.distributed


@pytest.fixture(scope="module")
def job_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("utilities_job")


@pytest.fixture(scope="module")
def two_ranks(job_dir: Path) -> list[dict[str, Any]]:
    return spawn_job("tests.helpers.jobs.utilities:observe", 2, timeout=120, tmp=str(job_dir))


def test_launch_sets_rank_zero_only_rank(two_ranks: list[dict[str, Any]]) -> None:
    r0, r1 = per_rank(two_ranks, "rank_zero")
    assert (r0["rank_zero_only.rank"], r0["global_rank"], r0["decorated"]) == (0, 0, "ran")
    assert (r1["rank_zero_only.rank"], r1["global_rank"], r1["decorated"]) == (1, 1, "skipped")
    assert r0["warnings"] == ["from rank 0"] and r1["warnings"] == []


def test_sampler_wrapper_splits_the_inner_sampler(two_ranks: list[dict[str, Any]]) -> None:
    results = per_rank(two_ranks, "sampler")
    n = jobs.N_INDICES
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
    order = torch.randperm(jobs.N_INDICES, generator=torch.Generator().manual_seed(100)).tolist()
    for rank, r in enumerate(results):
        positions = list(DistributedSampler(range(jobs.N_INDICES), num_replicas=2, rank=rank, seed=7))
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
