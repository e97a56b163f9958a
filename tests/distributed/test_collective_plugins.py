"""Plugins beyond precision on real gloo process groups: ``TorchCollective``, a user's ``CheckpointIO`` and
``FSDPPrecision``.

* Every ``TorchCollective`` call on 2 and 3 ranks, and a group that leaves a rank out
  (tests/helpers/scripts/collective_plugins.py); the same results under Lightning Fabric, side by side (skipped
  without its venv: run ``.ci/setup``).
* A user's ``CheckpointIO`` under DDP on 2 ranks: only rank 0 writes, and every rank loads the complete file.
* FSDP on 2 ranks with ``FSDPPrecision`` trains bit for bit as with ``precision=``
  (tests/helpers/scripts/checkpoint_io_plugins.py).

The checks that start no process are in tests/unit/test_collective_plugins.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.helpers.harness import base_env, lightning_python, run_python
from tests.unit.test_collective_plugins import tensor

COLLECTIVE_SCRIPT = "tests/helpers/scripts/collective_plugins.py"


# ---------------------------------------------------------------------------------------------- collectives: ranks
def run_collectives(world: int, impl: str = "fabric_lite") -> list[dict[str, Any]]:
    python = lightning_python() if impl == "lightning" else None
    out = Path(run_collectives.tmp) / f"{impl}-{world}.json"  # type: ignore[attr-defined]
    done = run_python(
        [COLLECTIVE_SCRIPT, str(world), str(out)],
        timeout=150,
        env=base_env({"COLLECTIVE_IMPL": impl}),
        python=python,
    )
    assert done.returncode == 0 and out.is_file(), f"{impl} on {world} ranks failed:\n{done.output}"
    results: list[dict[str, Any]] = json.loads(out.read_text())
    out.unlink()
    for rank, result in enumerate(results):
        assert "traceback" not in result, f"rank {rank}:\n{result['traceback']}"
    return results


@pytest.fixture(scope="module")
def collective_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[int, list[dict[str, Any]]]:
    run_collectives.tmp = tmp_path_factory.mktemp("collectives")  # type: ignore[attr-defined]
    return {world: run_collectives(world) for world in (2, 3)}


@pytest.mark.distributed
@pytest.mark.timeout(400)
@pytest.mark.parametrize("world", [2, 3])
def test_every_torch_collective_call_on_real_ranks(collective_runs: dict[int, list[Any]], world: int) -> None:
    runs = collective_runs[world]
    total = world * (world + 1) / 2  # sum of rank + 1
    ranks = range(world)
    for rank, obs in enumerate(runs):
        assert obs["initialized_before"] is False and obs["initialized_after_setup"] is True
        assert obs["manages_default_group"] is True and obs["env_left_after_setup"] == []
        assert obs["group_before_setup"][:2] == ["raised", "ValueError"]
        assert obs["groups_after_create"] == 2  # the default group and the collective's own
        assert (obs["rank"], obs["world_size"]) == (rank, world)
        assert obs["create_group_twice"][:2] == ["raised", "RuntimeError"]
        assert obs["broadcast"] == tensor([float(world), 10.0 * (world - 1)])
        sums = [total, sum(2.0 * r + 3 for r in ranks)]
        products = [float(torch.arange(1, world + 1).prod()), float(torch.tensor([2 * r + 3 for r in ranks]).prod())]
        assert obs["all_reduce/sum"] == obs["all_reduce/SUM"] == tensor(sums)
        assert obs["all_reduce/max"] == obs["all_reduce/<RedOpType.MAX: 4>"] == tensor([world, 2.0 * world + 1])
        assert obs["all_reduce/min"] == tensor([1.0, 3.0])
        assert obs["all_reduce/product"] == obs["all_reduce/prod"] == tensor(products)
        assert obs["all_reduce/avg"] == obs["all_reduce/mean"] == tensor([s / world for s in sums])
        assert obs["all_reduce/nope"][:2] == obs["all_reduce/3"][:2] == ["raised", "ValueError"]
        assert obs["all_reduce/default"] == ["tensor", "torch.int64", [total]]  # "sum" by default
        assert obs["all_reduce/int_avg"][:2] == ["raised", "RuntimeError"]  # torch: AVG of integers
        assert obs["reduce"] == (total if rank == 0 else None)
        assert obs["all_gather"] == [tensor([2.0 * r, 2.0 * r + 1]) for r in ranks]
        assert obs["gather"] == ([tensor([3.0 * r]) for r in ranks] if rank == 0 else [])
        assert obs["scatter"] == tensor([10.0 * rank + 1])
        assert obs["reduce_scatter"] == tensor([sum(100.0 * rank + r for r in ranks)])
        assert obs["all_to_all"] == [tensor([10.0 * r + rank]) for r in ranks]
        assert obs["send_recv"] == ([7.0 * r for r in range(1, world)] if rank == 0 else [100.0 + rank])
        assert obs["barrier"] is None and obs["monitored_barrier"] is None
        assert obs["all_gather_object"] == [repr({"r": r}) for r in ranks]
        assert obs["broadcast_object_list"] == [f"from {world - 1}", world - 1]
        assert obs["gather_object"] == ([["g", r] for r in ranks] if rank == 0 else [])
        assert obs["scatter_object_list"] == [f"part {rank}"]
        # the classmethods: a group made and destroyed (twice: the second time nothing happens)
        assert obs["new_group/groups"] == 3 and obs["new_group/sum"] == tensor([total])
        assert obs["destroy_group/groups"] == obs["destroy_group_twice/groups"] == 2
        # teardown destroys the collective's group and the default group that setup() created
        assert obs["teardown/initialized"] is False and obs["teardown/groups"] == 0
        assert obs["teardown/manages_default_group"] is False
        assert obs["teardown_twice"][:2] == ["raised", "RuntimeError"]


@pytest.mark.distributed
@pytest.mark.timeout(400)
@pytest.mark.parametrize("world", [2, 3])
def test_a_group_that_leaves_a_rank_out(collective_runs: dict[int, list[Any]], world: int) -> None:
    members = [0, 2] if world == 3 else [1]
    for rank, obs in enumerate(collective_runs[world]):
        if rank in members:
            assert (obs["sub/rank"], obs["sub/world_size"]) == (members.index(rank), len(members))
            assert obs["sub/groups_after_create"] == 3
            assert obs["sub/all_reduce"] == tensor([float(sum(r + 1 for r in members))])
            assert obs["sub/broadcast"] == tensor([5.0 * members[-1]])
            assert obs["sub/all_gather"] == [tensor([r + 0.5]) for r in members]
        else:  # the outsider: torch's non-member group, every call a no-op that returns the input, no hang
            assert (obs["sub/rank"], obs["sub/world_size"]) == (-1, -1)
            assert obs["sub/groups_after_create"] == 2  # no group of its own was made
            assert obs["sub/all_reduce"] == tensor([rank + 1.0])
            assert obs["sub/broadcast"] == tensor([rank * 5.0])
            assert obs["sub/all_gather"] == [tensor([0.0]) for _ in members]
        assert obs["sub/barrier"] is None
        assert obs["sub/groups_after_teardown"] == 2 and obs["sub/group_after_teardown"] is None


# where fabric_lite deliberately differs: more op spellings, and messages that say what to do next
DIFFERENT = {"all_reduce/mean", "all_reduce/prod"}


def _comparable(value: Any) -> Any:
    # an error is compared by its type only: fabric_lite's messages say more
    return value[:2] if isinstance(value, list) and value[:1] == ["raised"] else value


@pytest.mark.compat
@pytest.mark.distributed
@pytest.mark.timeout(400)
@pytest.mark.skipif(lightning_python() is None, reason="no Lightning Fabric venv: run .ci/setup")
def test_same_collective_results_as_lightning(collective_runs: dict[int, list[Any]]) -> None:
    ours = collective_runs[3]
    theirs = run_collectives(3, impl="lightning")
    for rank, (a, b) in enumerate(zip(ours, theirs)):
        assert sorted(a) == sorted(b)
        for key in sorted(set(a) - DIFFERENT):
            assert _comparable(a[key]) == _comparable(b[key]), (rank, key, a[key], b[key])
        for key in DIFFERENT:  # Lightning refuses these spellings; fabric_lite reduces with them
            assert b[key][:2] == ["raised", "ValueError"] and a[key][0] == "tensor"


def run_plugin_script(mode: str, hows: list[str], folder: Path) -> dict[str, list[dict[str, Any]]]:
    """Each way of ``mode`` on two ranks, one after another in one launch; both ranks' records of each, by way."""
    args = ["-m", "tests.helpers.scripts.checkpoint_io_plugins", mode, ",".join(hows), "2", str(folder)]
    done = run_python(args, timeout=180 * len(hows))
    assert done.returncode == 0, done.output
    return {how: [json.loads((folder / how / f"rank{r}.json").read_text()) for r in range(2)] for how in hows}


@pytest.fixture(scope="module")
def io_runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, list[dict[str, Any]]]]:
    folder = tmp_path_factory.mktemp("checkpoint_io")
    return folder, run_plugin_script("io", ["plugins", "strategy"], folder)


@pytest.mark.distributed
@pytest.mark.timeout(240)
@pytest.mark.parametrize("how", ["plugins", "strategy"])
def test_users_checkpoint_io_on_two_ranks_only_rank_0_writes(
    io_runs: tuple[Path, dict[str, list[dict[str, Any]]]], how: str
) -> None:
    folder, runs = io_runs
    tmp_path = folder / how
    rank0, rank1 = runs[how]
    assert rank0["calls"] == [["save", "state.json", ["model", "step", "tag"], None], ["load", "state.json", None]]
    assert rank1["calls"] == [["load", "state.json", None]]  # rank 1 never writes, and reads the complete file
    for run in (rank0, rank1):
        assert run["remainder"] == {"step": 7, "tag": "json"} and run["restored_equal"] and run["is_strategy_io"]
    assert json.loads((tmp_path / "state.json").read_text())["tag"] == "json"


@pytest.mark.distributed
@pytest.mark.timeout(300)
def test_fsdp_precision_trains_exactly_as_the_precision_flag(tmp_path: Path) -> None:
    runs = run_plugin_script("fsdp_precision", ["plugin", "flag"], tmp_path)  # in the same two processes
    for a, b in zip(runs["plugin"], runs["flag"], strict=True):
        assert a["precision"] == b["precision"] == ["FSDPPrecision", "bf16-mixed"]  # the flag makes one, as Lightning's
        assert a["policy"] == b["policy"] == ["torch.bfloat16", "torch.bfloat16"]  # gradients reduced in bfloat16
        assert a["compute_dtypes"] == b["compute_dtypes"] == [["torch.bfloat16", "torch.bfloat16"]]
        assert a["shard_dtype"] == "torch.float32"
        assert a["losses"] == b["losses"] and a["state"] == b["state"]  # bitwise the same run
