"""``fabric_lite.utilities.distributed`` and ``Fabric.gather_for_metrics`` on 2 and 3 gloo ranks.

The 2- and 3-rank jobs of :mod:`tests.helpers.jobs.ddp_toolkit` check each utility against values built from the same
rank-dependent inputs: gathers with and without gradients, tensors of uneven shapes and the errors that name every
rank, ``sync_ddp`` with each reduce op, the infinite barrier, subgroups of 2 of 3 ranks, and metric gathers over 5
and 82 samples that see every sample once.

The checks that start no process are in tests/unit/test_distributed_utils.py.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from tests.helpers.jobs.ddp_toolkit import METRIC_CASES, SUBGROUP
from tests.helpers.toolkit_results import suite_results, values


# ---------------------------------------------------------------------------------------------- 2 ranks
@pytest.fixture(scope="module")
def two() -> list[dict[str, Any]]:
    return suite_results(2)


@pytest.fixture(scope="module")
def three() -> list[dict[str, Any]]:
    return suite_results(3)


def _is_value_error(observed: tuple[str, str, tuple[str, ...]]) -> bool:
    return "ValueError" in observed[2]


@pytest.mark.distributed
def test_the_infinite_barrier_outwaits_the_process_group_timeout(two: list[dict[str, Any]]) -> None:
    for waited in values(two, "infinite_barrier"):  # rank 0 slept 3 s; the default group's timeout was 1 s
        assert waited["waited"] >= 2.5 and not waited["group_left"]


@pytest.mark.distributed
def test_all_gather_ddp_without_sync_grads(two: list[dict[str, Any]]) -> None:
    for value in values(two, "all_gather_ddp/no_grad"):
        assert value == {"value": [[1.0, 1.0], [2.0, 2.0]], "requires_grad": False}


@pytest.mark.distributed
@pytest.mark.parametrize("case", ["all_gather_ddp/sync_grads", "all_gather_grad/apply"])
def test_all_gather_sync_grads_matches_the_hand_computed_gradient(two: list[dict[str, Any]], case: str) -> None:
    # rank r's loss weighs rank k's slice (of 2 elements) by (r + 1)(k + 2); the backward sums over the ranks,
    # so rank k's input gets sum_r (r + 1)(k + 2) = (k + 2) * W(W + 1)/2 per element
    world = 2
    for rank, value in enumerate(values(two, case)):
        assert value["value"] == [[1.0, 1.0], [2.0, 2.0]]
        assert value["grad"] == [(rank + 2) * world * (world + 1) / 2] * 2


@pytest.mark.distributed
def test_all_gather_ddp_shape_mismatch_raises_on_every_rank(two: list[dict[str, Any]]) -> None:
    for observed in values(two, "all_gather_ddp/mismatch"):
        assert _is_value_error(observed)
        assert "(1,)" in observed[1] and "(2,)" in observed[1]


def _uneven(shape_of: Any, world: int) -> list[Any]:
    out = []
    for rank in range(world):
        shape = shape_of(rank)
        t = torch.arange(math.prod(shape), dtype=torch.float32).reshape(shape) + 100 * rank
        out.append((list(shape), t.tolist()))
    return out


UNEVEN = {
    "1d": lambda r: (r + 1,),
    "2d": lambda r: (r + 1, 3 - r),
    "3d": lambda r: (2, r + 1, 1 + 2 * r),
    "empty": lambda r: (2 * r, 2),
    "scalar": lambda r: (),
}


@pytest.mark.distributed
@pytest.mark.parametrize("case", list(UNEVEN))
def test_gather_all_tensors_of_different_shapes(two: list[dict[str, Any]], case: str) -> None:
    assert values(two, f"gather_all/{case}") == [_uneven(UNEVEN[case], 2)] * 2


@pytest.mark.distributed
def test_gather_all_tensors_ndim_mismatch_names_every_rank(two: list[dict[str, Any]]) -> None:
    for observed in values(two, "gather_all/ndim_mismatch"):
        assert _is_value_error(observed)
        assert "rank 0: 1-d" in observed[1] and "rank 1: 2-d" in observed[1]
    for observed in values(two, "gather_all/dtype_mismatch"):
        assert _is_value_error(observed) and "torch.int64" in observed[1]


# rank r reduces [r + 1, 10 r - 3]: [1, -3] and [2, 7]
SYNC = {
    "none": [3.0, 4.0],
    "sum": [3.0, 4.0],
    "mean": [1.5, 2.0],
    "avg": [1.5, 2.0],
    "max": [2.0, 7.0],
    "ReduceOp.SUM": [3.0, 4.0],
    "ReduceOp.AVG": [1.5, 2.0],
}


@pytest.mark.distributed
@pytest.mark.parametrize("case", list(SYNC))
def test_sync_ddp(two: list[dict[str, Any]], case: str) -> None:
    for value in values(two, f"sync_ddp/{case}"):
        assert value == {"value": SYNC[case], "dtype": "torch.float32", "in_place": True}


@pytest.mark.distributed
def test_sync_ddp_integers_numbers_and_errors(two: list[dict[str, Any]]) -> None:
    for value in values(two, "sync_ddp/int_mean"):
        assert value == {"value": [1, 2], "dtype": "torch.int64", "in_place": True}  # 3 / 2 truncated
    assert values(two, "sync_ddp/number") == [3, 3]
    for observed in values(two, "sync_ddp/unknown_op"):
        assert _is_value_error(observed) and "'median'" in observed[1]
    assert values(two, "sync_ddp_if_available/mean") == [2.0, 2.0]


@pytest.mark.distributed
def test_init_dist_connection_with_a_group(two: list[dict[str, Any]]) -> None:
    for rank, value in enumerate(values(two, "init_dist_connection")):
        assert value["same"] is None and value["rank"] == rank
        assert value["other_size"][0] == "RuntimeError" and "world size 2" in value["other_size"][1]
        assert value["other_backend"][0] == "RuntimeError" and "backend='gloo'" in value["other_backend"][1]


@pytest.mark.distributed
def test_register_ddp_comm_hook_function(two: list[dict[str, Any]]) -> None:
    for value in values(two, "register_ddp_comm_hook"):
        assert value["max_error_vs_fp16_reference"] == 0.0
        assert value["not_ddp"][0] == "TypeError" and "got Linear" in value["not_ddp"][1]
        assert value["wrapper_without_hook"][0] == "ValueError"
        assert value["nothing"] is None


@pytest.mark.distributed
@pytest.mark.parametrize("world", [2, 3])
def test_every_check_left_the_group_healthy(two: list[dict[str, Any]], three: list[dict[str, Any]], world: int) -> None:
    results = two if world == 2 else three
    assert values(results, "healthy_after") == [world * (world + 1) / 2] * world


# ---------------------------------------------------------------------------------------------- 3 ranks: subgroups
@pytest.mark.distributed
def test_subgroup_utilities(three: list[dict[str, Any]]) -> None:
    assert not any(key.startswith("subgroup/") for key in three[1]), "rank 1 is outside the subgroup"
    member_values = {key: values(three, f"subgroup/{key}", SUBGROUP) for key in (
        "all_gather_ddp_sync_grads", "gather_all_tensors", "sync_ddp_mean", "sync_ddp_sum", "fabric_all_reduce",
        "fabric_all_gather",
    )}  # fmt: skip
    # members are global ranks 0 and 2 (inputs 1 and 3); member m's loss weighs member k's slice by (m + 1)(k + 2)
    for member, value in enumerate(member_values["all_gather_ddp_sync_grads"]):
        assert value["value"] == [[1.0, 1.0], [3.0, 3.0]]
        assert value["grad"] == [(member + 2) * 3.0] * 2
    assert member_values["gather_all_tensors"] == [[[0], [20, 21, 22]]] * 2
    assert member_values["sync_ddp_mean"] == [2.0, 2.0]
    assert member_values["sync_ddp_sum"] == [4, 4]
    assert member_values["fabric_all_reduce"] == [4.0, 4.0]
    assert member_values["fabric_all_gather"] == [[[0], [2]]] * 2
    for observed in values(three, "subgroup/ndim_mismatch", SUBGROUP):
        assert _is_value_error(observed) and "rank 0: 1-d" in observed[1] and "rank 2: 2-d" in observed[1]


# ---------------------------------------------------------------------------------------------- metrics
def _expected_metrics(size: int, batch_size: int, world: int) -> dict[str, Any]:
    per_rank = math.ceil(size / world)
    full_batches = per_rank // batch_size
    return {
        "per_batch": list(range(size)),
        "naive_count": per_rank * world,
        "nested_ok": True,
        "accuracy": math.ceil(size / 2) / size,  # the job's predictions are right on even samples
        "whole_epoch": list(range(size)),
        "sampler_drop_last": list(range(size // world * world)),
        "loader_drop_last": list(range(min(size, full_batches * batch_size * world))),
        "unsplit_count": size * world,
    }


@pytest.mark.distributed
@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize(("size", "batch_size"), METRIC_CASES, ids=[f"{n}samples" for n, _ in METRIC_CASES])
def test_gather_for_metrics_sees_every_sample_once_in_order(
    two: list[dict[str, Any]], three: list[dict[str, Any]], world: int, size: int, batch_size: int
) -> None:
    results = two if world == 2 else three
    expected = _expected_metrics(size, batch_size, world)
    for value in values(results, f"metrics/{size}"):
        shuffled = value.pop("shuffled")
        assert value == expected
        assert len(shuffled) == size and sorted(shuffled) == list(range(size))
    if size % world:
        assert expected["naive_count"] > size  # the plain all_gather does see the padded duplicates


@pytest.mark.distributed
@pytest.mark.parametrize("world", [2, 3])
def test_gather_for_metrics_errors(two: list[dict[str, Any]], three: list[dict[str, Any]], world: int) -> None:
    results = two if world == 2 else three
    messages = {
        "scalar": "same first (batch) dimension",
        "rows": "during batch 0 of the dataloader, which holds 2 samples",
        "no_loader": "Pass it: fabric.gather_for_metrics(data, dataloader=val_loader)",
        "too_many_rows": "got 9 rows",
    }
    for case, message in messages.items():
        for observed in values(results, f"metrics_error/{case}"):
            assert observed[0] == "ValueError" and message in observed[1], observed
