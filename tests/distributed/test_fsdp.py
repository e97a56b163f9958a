"""FSDPStrategy: sharded training on torch's ``fully_shard`` (FSDP2) and its checkpoints.

On real gloo process groups on the CPU started by fabric_lite's own script launcher
(tests/helpers/jobs/fsdp_jobs.py). Every 2-rank job runs in one launch, each with a Fabric of its own:

* 10 steps match DistributedDataParallel (losses, clipped norms, parameters), each rank holds half of the parameters,
  ``no_backward_sync`` matches DDP's ``no_sync``, meta-device initialisation equals eager initialisation with the same
  seed, every misuse raises clearly, and sharded and full checkpoints are written (atomically: a failed save leaves
  the previous one intact);
* ``16-mixed``, activation checkpointing, CPU offload and a size-based wrap policy;
* Lightning's ``sharding_strategy``: ``SHARD_GRAD_OP`` gives exactly FULL_SHARD's losses and ``NO_SHARD`` matches
  torch's plain ``fully_shard``; each saves and loads sharded and full checkpoints.

Then, each in a launch of its own:

* one and three ranks (``Fabric(strategy="fsdp")``): those checkpoints, their consolidation and a DDP checkpoint
  load exactly, and the next step lands where it did on two ranks;
* ``HYBRID_SHARD`` on a (2, 2) mesh of four ranks matches ``fully_shard``, and saves and loads both checkpoints;
* FSDP1's arguments that Lightning passes through ``**kwargs`` (tests/unit/test_sharded_lightning_arguments.py checks
  them in one process): ``process_group`` (a group, and a hybrid pair), ``sync_module_states``, ``ignored_modules`` and
  ``ignored_states``, ``forward_prefetch`` and the no-op flags, on two ranks; Lightning's
  ``_get_full_state_dict_context``.

The checks that start no process are in tests/unit/test_fsdp.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.helpers.harness import per_rank, run_job, run_python, series_job, spawn_job
from tests.helpers.jobs.fsdp_jobs import Net

LAUNCH_TIMEOUT = 150  # seconds for one launch of 1-3 ranks (a loaded 2-core CI machine needs ~30 s)


def fsdp_job(job: str, nprocs: int, **options: Any) -> list[dict[str, Any]]:
    """Run ``tests.helpers.jobs.fsdp_jobs.<job>`` on ``nprocs`` ranks through Fabric's script launcher; every rank's
    result."""
    return run_job(["-m", "tests.helpers.jobs.fsdp_jobs", job, str(nprocs), json.dumps(options)], LAUNCH_TIMEOUT)  # type: ignore[no-any-return]


def test_importing_loads_neither_fsdp_nor_dcp() -> None:
    code = (
        "import sys; import fabric_lite, fabric_lite.strategies, fabric_lite.utilities;"
        "print([m for m in sys.modules if m.startswith(('torch.distributed.fsdp', 'torch.distributed.checkpoint',"
        " 'torch.distributed.tensor'))])"
    )
    done = run_python(["-c", code], timeout=60)
    assert done.returncode == 0, done.output
    assert done.stdout.strip() == "[]", done.output


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fsdp")


@pytest.fixture(scope="module")
def two_rank_jobs(folder: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[dict[str, Any]]]:
    """Every 2-rank job, in one launch (each a Fabric of its own over the same two processes), in this order:

    * ``train_and_save``: FULL_SHARD with the blocks as units; checkpoints into ``folder``;
    * ``options``: ``16-mixed``, a size policy, activation checkpointing and CPU offload;
    * ``shard_grad_op`` and ``no_shard``: the other sharding strategies, with checkpoints of their own.
    """
    other = tmp_path_factory.mktemp("fsdp_sharding")
    blocks = {"auto_wrap_policy": ["Block"]}
    options = {"auto_wrap_policy": 1000, "activation_checkpointing_policy": ["Block"], "cpu_offload": True}
    jobs = {
        "train_and_save": {"job": "train_and_save", "strategy": blocks, "kwargs": {"folder": str(folder)}},
        "options": {"job": "options", "strategy": options, "precision": "16-mixed"},
        **{
            name: {
                "job": "sharding_strategies",
                "strategy": {**blocks, "sharding_strategy": name.upper()},
                "kwargs": {"folder": str(other / name)},
            }
            for name in ("shard_grad_op", "no_shard")
        },
    }
    return series_job("tests.helpers.jobs.fsdp_jobs", 2, jobs, LAUNCH_TIMEOUT * len(jobs))


@pytest.fixture(scope="module")
def two_ranks(two_rank_jobs: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    return two_rank_jobs["train_and_save"]


@pytest.mark.timeout(200)
def test_ten_steps_match_ddp(two_ranks: list[dict[str, Any]]) -> None:
    runs = per_rank(two_ranks, "parity")
    for run in runs:
        torch.testing.assert_close(run["losses"], run["ref_losses"], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(run["norms"], run["ref_norms"], rtol=1e-5, atol=1e-6)
        assert min(run["norms"]) > 0.5  # the clipping was active on some steps at least
        assert run["param_difference"] < 1e-6
    assert runs[0]["norms"] == runs[1]["norms"]  # the total norm over every shard, the same on every rank
    assert runs[0]["losses"] != runs[1]["losses"]  # each rank trained on its own half of the batch


@pytest.mark.timeout(200)
def test_setup_with_an_optimizer_trains_as_an_optimizer_created_after_setup(two_ranks: list[dict[str, Any]]) -> None:
    for run in per_rank(two_ranks, "joint_setup"):
        assert run["steps"] == run["ref_steps"]  # losses and clipped norms, exactly
        assert run["param_difference"] == 0.0
        assert run["optimizer_holds_the_model"]


@pytest.mark.timeout(200)
def test_each_rank_holds_half_of_the_parameters(two_ranks: list[dict[str, Any]]) -> None:
    runs = per_rank(two_ranks, "sharding")
    total = runs[0]["total"]
    assert total == sum(p.numel() for p in Net().parameters())
    assert sum(run["local"] for run in runs) == total  # every element held exactly once
    for run in runs:
        assert run["all_dtensors"]
        assert abs(run["local"] - total / 2) <= 0.02 * total  # uneven first dimensions round per parameter
        assert run["units"] == ["", "blocks.0", "blocks.1"]  # the policy's blocks, inside the root


@pytest.mark.timeout(200)
def test_no_backward_sync_matches_ddp_no_sync(two_ranks: list[dict[str, Any]]) -> None:
    for run in per_rank(two_ranks, "no_sync"):
        assert run["grad_difference"] < 1e-6


@pytest.mark.timeout(200)
def test_meta_device_init_equals_eager_init_with_the_same_seed(two_ranks: list[dict[str, Any]]) -> None:
    for run in per_rank(two_ranks, "meta_init"):
        assert run["on_meta"]
        assert run["keys_match"]
        assert run["difference"] == 0.0  # exactly the eager values, buffers included
        assert run["rng_as_after_eager"]  # and the generator advanced exactly as much
        assert run["still_tied"] and run["forward_finite"]


@pytest.mark.timeout(200)
def test_misuse_raises_clearly(two_ranks: list[dict[str, Any]], folder: Path) -> None:
    runs = per_rank(two_ranks, "misuse")
    for run in runs:
        joint = run["stepped_joint_setup"]
        assert joint["type"] == "ValueError" and "already holds state for" in joint["message"]
        assert "fabric.setup_module(model)" in joint["message"]
        first = run["optimizer_first"]
        assert first["type"] == "ValueError"
        assert "created before fabric.setup_module(model)" in first["message"]
        assert "setup_optimizers(torch.optim.AdamW(model.parameters()))" in first["message"]
        meta = run["meta_without_reset"]  # Lightning's warning; the module is materialised, its Linear initialised
        assert any("re-initialization: NoReset (<root>)" in message for message in meta["warnings"]) == (
            run is runs[0]
        ), meta["warnings"]  # on rank 0 only
        assert meta["on_meta"] == [] and meta["lin_finite"]
        plain_folder = str(folder / "not_a_checkpoint")
        assert run["load_plain_folder"]["type"] == "NotACheckpointError"  # a CheckpointError and a ValueError
        assert plain_folder in run["load_plain_folder"]["message"]
        assert run["save_over_plain_folder"]["type"] == "CheckpointError"
        assert plain_folder in run["save_over_plain_folder"]["message"]
        assert run["plain_folder_kept"] == ["notes.txt"]
        assert run["load_missing"]["type"] == "FileNotFoundError"
        assert run["no_sync_unsharded"]["type"] == "TypeError"
        assert run["after"] == 2.0  # both ranks are still in step
    metadata = per_rank(two_ranks, "metadata_file")
    for run in metadata:
        assert run["type"] == "CheckpointError" and str(folder / "sharded") in run["message"]


@pytest.mark.timeout(200)
def test_checkpoints_are_complete_when_save_returns(two_ranks: list[dict[str, Any]]) -> None:
    for run in per_rank(two_ranks, "save"):
        assert run["files_on_return"] == [".metadata", "__0_0.distcp", "__1_0.distcp", "fabric_lite.json", "meta.pt"]
        assert run["full_file_on_return"]
        assert run["leftovers"] == []  # no temporary folder or file beside the checkpoints


@pytest.mark.timeout(200)
def test_a_failed_sharded_save_keeps_the_previous_checkpoint(two_ranks: list[dict[str, Any]], folder: Path) -> None:
    for run in per_rank(two_ranks, "replace_and_fail"):
        assert run["step_after_replace"] == ({}, 2)  # the module entry is not returned as a plain value
        failure = run["failure"]
        assert failure["type"] == "CheckpointError"  # on both ranks, though only one rank's write failed
        assert str(folder / "replaced") in failure["message"] and "refuses to be pickled" in failure["message"]
        assert run["previous_intact"]
        assert run["leftovers"] == []
        assert run["after"] == 2.0


# ---------------------------------------------------------------------------------------------- other world sizes
@pytest.fixture(scope="module")
def consolidated(two_ranks: list[dict[str, Any]], folder: Path) -> Path:
    target = folder / "consolidated.pt"
    done = run_python(["-m", "fabric_lite.utilities.consolidate", str(folder / "sharded"), str(target)], timeout=60)
    assert done.returncode == 0, done.output
    assert f"wrote {target}" in done.stdout
    return target


@pytest.fixture(scope="module", params=[1, 3], ids=["one_rank", "three_ranks"])
def loaded(request: pytest.FixtureRequest, consolidated: Path, folder: Path) -> list[dict[str, Any]]:
    return fsdp_job("load_and_continue", request.param, strategy="fsdp", kwargs={"folder": str(folder)})


def test_consolidate_command_reports_a_non_fsdp_checkpoint(folder: Path, tmp_path: Path) -> None:
    plain = tmp_path / "plain.ckpt"
    torch.save({"model": {}}, plain)
    done = run_python(["-m", "fabric_lite.utilities.consolidate", str(plain), str(tmp_path / "out.pt")], timeout=60)
    assert done.returncode == 1
    assert str(plain) in done.stderr and "not a sharded checkpoint folder" in done.stderr


@pytest.mark.timeout(240)
@pytest.mark.parametrize("name", ["sharded", "full.ckpt", "consolidated.pt"])
def test_checkpoints_saved_on_two_ranks_load_at_another_world_size(loaded: list[dict[str, Any]], name: str) -> None:
    assert [run["world_size"] for run in loaded] == [len(loaded)] * len(loaded)
    for run in per_rank(loaded, name):
        assert run["model_difference"] == 0.0 and run["momentum_difference"] == 0.0
        assert run["step"] == 10 and run["counter"] == 7 and run["wrappers_kept"]
        assert run["remainder"] == {"extra": {"note": "hi"}}
        # the next step from the restored state lands where it did on two ranks
        assert run["next_difference"] < 1e-6


@pytest.mark.timeout(240)
def test_a_ddp_checkpoint_loads_into_the_sharded_model(loaded: list[dict[str, Any]]) -> None:
    for run in per_rank(loaded, "ddp.ckpt"):
        # optimizer state keyed by position (optimizer.state_dict()) is matched to the parameters by name
        assert run["model_difference"] == 0.0 and run["momentum_difference"] == 0.0
        assert run["step"] == 10 and run["remainder"] == {}


@pytest.mark.timeout(240)
def test_whole_sharded_checkpoint_and_strict_loading(loaded: list[dict[str, Any]], folder: Path) -> None:
    for run in per_rank(loaded, "everything"):
        assert run["keys"] == ["counter", "extra", "model", "optimizer", "step"] and run["step"] == 10
        assert run["model_keys"] == sorted(Net().state_dict())
    for run in per_rank(loaded, "strictness"):
        assert run["strict_error"]["type"] == "KeyError"
        assert (
            "['absent']" in run["strict_error"]["message"] and str(folder / "sharded") in run["strict_error"]["message"]
        )
        assert run["remainder"] == {"counter": {"value": 7}, "extra": {"note": "hi"}, "step": 10}
        assert run["absent_kept"] == 1 and run["model_difference"] == 0.0


# ---------------------------------------------------------------------------------------------- options
def test_16_mixed_activation_checkpointing_cpu_offload_and_size_policy(
    two_rank_jobs: dict[str, list[dict[str, Any]]],
) -> None:
    runs = two_rank_jobs["options"]
    for run in per_rank(runs, "training"):
        assert run["units"] == ["", "blocks.0", "blocks.1"]  # 1104 parameters per block >= 1000
        assert run["forward_calls_per_step"] == 2.0  # the checkpointed block recomputes its forward in backward
        assert run["compute_dtypes"] == [("torch.float16", "torch.float16")]  # gathered and computed in float16
        assert run["shard_dtype"] == "torch.float32" and run["grad_is_sharded_fp32"]  # float32 shards and grads
        assert run["shard_device"] == "cpu"
        assert run["scaler"] == "ShardedGradScaler"
        torch.testing.assert_close(run["losses"], run["ref_losses"], rtol=2e-3, atol=0)
    for run in per_rank(runs, "skipped_step_agreed"):
        # an inf in rank 1's shard only: both ranks skip the step and halve the scale
        assert run["unchanged"] == 0.0
        assert run["scale"] == (256.0, 128.0)


# ---------------------------------------------------------------------------------------------- sharding strategies
def test_shard_grad_op_equals_full_shard_exactly(
    two_ranks: list[dict[str, Any]], two_rank_jobs: dict[str, list[dict[str, Any]]]
) -> None:
    runs = two_rank_jobs["shard_grad_op"]
    full_shard = per_rank(two_ranks, "parity")  # the same model, data and steps with the default FULL_SHARD
    for run, full in zip(per_rank(runs, "training"), full_shard):
        assert run["losses"] == run["ref_losses"] == full["losses"]
        assert run["norms"] == run["ref_norms"] == full["norms"]
        assert run["param_difference"] == 0.0
        assert run["gathered_after_forward"] == [True] * 10  # kept until backward: ZeRO-2
        assert run["mesh"] == ((2,), ("shard",))
    training = per_rank(runs, "training")
    assert sum(run["local"] for run in training) == training[0]["total"]  # each parameter held once
    for run in per_rank(runs, "checkpoint"):
        for name in ("sharded", "full.ckpt"):
            assert run[name] == {"model_difference": 0.0, "momentum_difference": 0.0, "step": 10}


@pytest.mark.timeout(300)
def test_hybrid_shard_on_a_2x2_mesh_equals_full_shard(tmp_path: Path) -> None:
    strategy = {"auto_wrap_policy": ["Block"], "sharding_strategy": "HYBRID_SHARD", "device_mesh": [2, 2]}
    runs = fsdp_job("sharding_strategies", 4, strategy=strategy, kwargs={"folder": str(tmp_path)})
    trained = per_rank(runs, "training")
    for run in trained:
        torch.testing.assert_close(run["losses"], run["ref_losses"], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(run["norms"], run["ref_norms"], rtol=1e-5, atol=1e-6)
        assert run["param_difference"] < 1e-6
        assert run["gathered_after_forward"] == [False] * 10  # resharded after forward, as FULL_SHARD
        assert run["mesh"] == ((2, 2), ("replicate", "shard"))
        assert run["placements"] == ["(Replicate(), Shard(dim=0))"]
    # sharded within each group of 2 ranks ((0, 1) and (2, 3)), the groups replicas of each other
    total = trained[0]["total"]
    assert trained[0]["local"] + trained[1]["local"] == trained[2]["local"] + trained[3]["local"] == total
    assert trained[0]["local"] == trained[2]["local"] < total
    assert len({tuple(run["norms"]) for run in trained}) == 1  # the same total norm on every rank
    assert len({tuple(run["losses"]) for run in trained}) == 4  # each rank trained on its own quarter
    for run in per_rank(runs, "checkpoint"):
        for name in ("sharded", "full.ckpt"):
            assert run[name] == {"model_difference": 0.0, "momentum_difference": 0.0, "step": 10}


def test_no_shard_replicates_and_equals_full_shard(two_rank_jobs: dict[str, list[dict[str, Any]]]) -> None:
    runs = two_rank_jobs["no_shard"]
    for run in per_rank(runs, "training"):
        torch.testing.assert_close(run["losses"], run["ref_losses"], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(run["norms"], run["ref_norms"], rtol=1e-5, atol=1e-6)
        assert run["param_difference"] < 1e-6
        assert run["mesh"] == ((2, 1), ("replicate", "shard"))
        assert run["local"] == run["total"]  # every rank holds every parameter
    for run in per_rank(runs, "checkpoint"):
        for name in ("sharded", "full.ckpt"):
            assert run[name] == {"model_difference": 0.0, "momentum_difference": 0.0, "step": 10}


# ---------------------------------------------------------------------------------------------- FSDP1's arguments
@pytest.fixture(scope="module")
def fsdp1_arguments() -> list[dict[str, Any]]:
    return spawn_job("tests.helpers.jobs.fsdp_jobs:fsdp1_arguments", 2, timeout=LAUNCH_TIMEOUT)


@pytest.mark.timeout(200)
def test_sync_module_states_starts_every_rank_from_rank_zeros_values(fsdp1_arguments: list[dict[str, Any]]) -> None:
    for run in per_rank(fsdp1_arguments, "sync_module_states"):
        assert run["mesh"] == (("shard",), 2)  # process_group=: the mesh is the group's
        assert run["eager"] == 0.0 and run["meta"] == 0.0  # ranks seeded differently, both hold rank 0's values


@pytest.mark.timeout(200)
def test_a_hybrid_pair_of_process_groups_makes_the_mesh(fsdp1_arguments: list[dict[str, Any]]) -> None:
    for run in per_rank(fsdp1_arguments, "hybrid_pair"):
        assert run["mesh"] == (("replicate", "shard"), (1, 2))
        assert run["losses"] == run["full_shard"]  # one replica of two shards is FULL_SHARD


@pytest.mark.timeout(200)
def test_ignored_modules_stay_whole_and_forward_prefetch_chains_the_units(
    fsdp1_arguments: list[dict[str, Any]],
) -> None:
    for run in per_rank(fsdp1_arguments, "ignored_and_prefetch"):
        assert run["chained"] == [1, 1, 0]  # the root prefetches blocks.0, which prefetches blocks.1
        assert run["losses"] == run["plain"]  # prefetching and the no-op flags change no number
        assert run["whole"] == ["inp.bias", "out.bias", "out.weight"]  # ignored_states' parameter, ignored module
        assert "inp.weight" in run["dtensors"] and len(run["dtensors"]) == 13


@pytest.mark.timeout(200)
def test_full_state_dict_context_gives_rank_zero_the_whole_tensors(fsdp1_arguments: list[dict[str, Any]]) -> None:
    first, second = per_rank(fsdp1_arguments, "full_state_dict_context")
    assert first["keys"] == 16 and first["difference"] == 0.0
    assert second["keys"] == 0  # rank0_only: the other ranks get nothing, as under FSDP1
    for run in (first, second):
        assert run["plain"] and run["after"]  # rank0_only=False: plain CPU tensors everywhere; DTensors after
