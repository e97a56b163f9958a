"""Every precision on two real gloo ranks with DistributedDataParallel."""

from __future__ import annotations

import pytest

from tests.helpers.harness import spawn_job
from tests.helpers.jobs.precision import PRECISIONS

pytestmark = pytest.mark.distributed

EXPECTED_DTYPES = {
    "32-true": ("torch.float32", "torch.float32"),
    "64-true": ("torch.float64", "torch.float64"),
    "bf16-mixed": ("torch.float32", "torch.float32"),
    "16-mixed-scaler": ("torch.float32", "torch.float32"),
    "16-true": ("torch.float16", "torch.float16"),
    "bf16-true": ("torch.bfloat16", "torch.bfloat16"),
}


@pytest.fixture(scope="module")
def runs() -> list[dict]:
    return spawn_job("tests.helpers.jobs.precision:all_precisions", 2, timeout=120)


@pytest.mark.parametrize("name", PRECISIONS)
def test_dtypes_and_identical_weights_on_both_ranks(runs: list[dict], name: str) -> None:
    r0, r1 = runs[0][name], runs[1][name]
    assert (r0["param_dtype"], r0["grad_dtype"]) == EXPECTED_DTYPES[name]
    assert r0["params"] == r1["params"]  # DDP kept the replicas identical
    assert r0["losses"] != r1["losses"]  # the ranks saw different data


def test_an_overflow_on_one_rank_makes_every_rank_skip_the_step(runs: list[dict]) -> None:
    for rank in range(2):
        run = runs[rank]["16-mixed-scaler"]
        assert run["skipped"] == [False, True, False], f"rank {rank}"
        assert run["scale"] == 512.0, f"rank {rank}"
