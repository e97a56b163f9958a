import pytest
import torch

from tests.helpers.harness import spawn_job


@pytest.mark.distributed
def test_spawn_job_two_ranks():
    results = spawn_job("tests.distributed.test_smoke_dist:ranks", 2)
    assert results == [{"rank": 0, "world": 2, "sum": 3.0}, {"rank": 1, "world": 2, "sum": 3.0}]


# ------------------------------------------------- the job: run on every rank by tests/helpers/jobs/_runner.py


def ranks(fabric):
    return {
        "rank": fabric.global_rank,
        "world": fabric.world_size,
        "sum": fabric.all_reduce(torch.tensor(float(fabric.global_rank + 1)), reduce_op="sum").item(),
    }
