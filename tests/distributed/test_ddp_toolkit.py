"""The DDP toolkit on 2 gloo ranks: communication hooks, post-local SGD, sync batchnorm, backward sync, DDP arguments.

The tests read one 2-rank job (:mod:`tests.helpers.jobs.ddp_toolkit`, shared through tests/helpers/toolkit_results.py),
whose references are computed from the same rank-dependent inputs: the ranks' own gradients without DDP, one
process's BatchNorm over the concatenated batch, the average of the ranks' local SGD steps.

The checks that start no process are in tests/unit/test_ddp_toolkit.py.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from tests.helpers.toolkit_results import suite_results, values


@pytest.fixture(scope="module")
def two() -> list[dict[str, Any]]:
    return suite_results(2)


@pytest.mark.distributed
def test_no_hook_averages_the_ranks_gradients(two: list[dict[str, Any]]) -> None:
    for value in values(two, "hook/none"):
        torch.testing.assert_close(torch.tensor(value["synced"]), torch.tensor(value["mean_of_local"]))


@pytest.mark.distributed
@pytest.mark.parametrize("case", ["hook/fp16", "hook/fp16_wrapper_allreduce"])
def test_fp16_compression(two: list[dict[str, Any]], case: str) -> None:
    for value in values(two, case):
        # bit for bit what float16 compression gives: each rank's gradients / 2 in float16, summed in float16
        assert value["max_error_vs_fp16_reference"] == 0.0
        # and close to the uncompressed average (float16 keeps ~3 significant digits), yet not equal to it
        assert value["max_error_vs_uncompressed"] <= 1e-3 * value["max_abs"]
        assert value["differs_from_uncompressed"]


@pytest.mark.distributed
def test_powersgd_of_a_low_rank_gradient_matches_the_uncompressed_one(two: list[dict[str, Any]]) -> None:
    for value in values(two, "hook/powersgd"):
        assert value["max_error_vs_uncompressed"] <= 1e-5 * value["max_abs"]
    for value in values(two, "hook/powersgd_fp16_wrapper"):
        assert value["max_error_vs_uncompressed"] <= 2e-3 * value["max_abs"]


@pytest.mark.distributed
def test_powersgd_really_compresses(two: list[dict[str, Any]]) -> None:
    for value in values(two, "hook/powersgd_rank1_state"):
        assert value["iter"] == 3
        assert 0 < value["numel_after"] < value["numel_before"]
        # rank 1 cannot hold the sum of two ranks' rank-1 gradients: compression changed them
        assert value["max_error_vs_uncompressed"] > 1e-2


@pytest.mark.distributed
def test_bf16_compression_on_cpu_is_torchs_error(two: list[dict[str, Any]]) -> None:
    # torch only registers bf16_compress_hook with CUDA and NCCL; fabric_lite passes its error on at setup
    for name, message, _ in values(two, "hook/bf16_cpu"):
        assert name == "TypeError" and "BF16" in message


# after the optimizer step k (0-based), with start_localSGD_iter=2 and model_averaging_period=3
EQUAL_AFTER_STEP = [True, True, True, False, False, True, False, False]


GRADS_SYNCED = [True, True, False, False, False, False, False, False]


@pytest.mark.distributed
@pytest.mark.parametrize("state", ["factory", "instance"])
def test_post_local_sgd_averages_on_schedule(two: list[dict[str, Any]], state: str) -> None:
    for steps in values(two, f"post_local_sgd/{state}"):
        assert [s["equal_across_ranks"] for s in steps] == EQUAL_AFTER_STEP
        assert [s["grad_equal_across_ranks"] for s in steps] == GRADS_SYNCED
        for step, observed in enumerate(steps):
            if EQUAL_AFTER_STEP[step]:
                # synced gradients (steps 0, 1) or averaging (steps 2, 5): the mean of the ranks' local updates
                assert observed["error_vs_average_of_local_steps"] <= 1e-6, step
            else:
                assert observed["error_vs_average_of_local_steps"] > 1e-4, step


@pytest.mark.distributed
def test_sync_batchnorm_equals_one_batchnorm_over_the_global_batch(two: list[dict[str, Any]]) -> None:
    observed = values(two, "sync_batchnorm/on")
    for value in observed:
        assert value["layer_type"] == "CPUSyncBatchNorm"
        assert value["num_batches_tracked"] == 1
        for key in ("out_error", "grad_error", "running_mean_error", "running_var_error", "param_error", "eval_error"):
            assert value[key] <= 1e-12, key
    assert observed[0]["running_mean"] == observed[1]["running_mean"]


@pytest.mark.distributed
def test_without_sync_batchnorm_the_statistics_are_local(two: list[dict[str, Any]]) -> None:
    # the control: the same comparison fails without sync_batchnorm, so the test above can fail
    for value in values(two, "sync_batchnorm/off"):
        assert value["layer_type"] == "BatchNorm1d"
        assert value["running_mean_error"] > 1e-3 and value["out_error"] > 1e-3


@pytest.mark.distributed
def test_sync_batchnorm_converts_nested_and_4d_layers(two: list[dict[str, Any]]) -> None:
    for value in values(two, "sync_batchnorm/nested"):
        assert value["types"] == ["CPUSyncBatchNorm", "CPUSyncBatchNorm"]
        assert value["same_parameter_object"]
        assert value["out_error"] <= 1e-5 and value["running_error"] <= 1e-5


@pytest.mark.distributed
@pytest.mark.parametrize("api", ["block_backward_sync", "no_backward_sync"])
def test_blocked_backward_sync_accumulates_locally(two: list[dict[str, Any]], api: str) -> None:
    for value in values(two, api):
        assert value["inside_error_vs_local"] == 0.0
        assert not value["inside_equal_across_ranks"]
        assert value["after_error_vs_mean_of_accumulated"] <= 1e-12


@pytest.mark.distributed
def test_ddp_arguments_reach_distributed_data_parallel(two: list[dict[str, Any]]) -> None:
    expected = {
        "bucket_bytes_cap": 1024 * 1024,
        "gradient_as_bucket_view": True,
        "broadcast_buffers": False,
        "default_find_unused_parameters": False,
        "find_unused_parameters": True,
    }
    assert values(two, "ddp_arguments") == [expected, expected]


@pytest.mark.distributed
def test_strategy_reduce(two: list[dict[str, Any]]) -> None:
    # ranks hold 1. and 3.: mean 2.; a sum of ones is 2.; a non-tensor comes back unchanged
    assert values(two, "strategy_reduce") == [[2.0, 2.0, "x"]] * 2
