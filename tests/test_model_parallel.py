"""ModelParallelStrategy: tensor, sequence and sharded data parallelism (and HSDP) on a DeviceMesh.

Arguments and the mesh arithmetic are checked without processes. The rest runs on real gloo process groups of 1, 2
and 4 CPU ranks through fabric_lite's own script launcher (tests/jobs/model_parallel_jobs.py), with a tiny two-block
Llama-style model: losses over 10 steps equal one process over the global batch in every layout, each rank holds
the expected fraction of every parameter, the ranks of a tensor-parallel group see the same batches, and a
checkpoint saved on 2x2 loads on 1x4, 4x1, one rank, a plain module and through the consolidation command.
"""

from __future__ import annotations

import json
import pickle
import tempfile
from datetime import timedelta
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import torch

from fabric_lite import Fabric
from fabric_lite.strategies import ModelParallelStrategy
from fabric_lite.strategies._model_parallel_ops import mesh_shape as _mesh_shape
from fabric_lite.strategies.parallelize import TransformerPlan, parallelize_transformer
from tests._harness import base_env, lightning_python, per_rank, run_python
from tests.jobs.model_parallel_jobs import STEPS, Llama, reference

LAUNCH_TIMEOUT = 180  # seconds for one launch of 1-4 ranks on a loaded 2-core machine (~20 s when quiet)
TOLERANCE = 1e-5


def mp_job(job: str, nprocs: int, **options: Any) -> list[Any]:
    """Run ``tests.jobs.model_parallel_jobs.<job>`` on ``nprocs`` ranks; every rank's result."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "result.pkl"
        done = run_python(
            ["-m", "tests.jobs.model_parallel_jobs", job, str(nprocs), json.dumps(options), str(out)],
            timeout=LAUNCH_TIMEOUT,
        )
        if done.returncode != 0 or not out.is_file():
            pytest.fail(f"job {job} on {nprocs} ranks failed with exit code {done.returncode}.\n{done.output}")
        return pickle.loads(out.read_bytes())  # type: ignore[no-any-return]


def _identity(module: torch.nn.Module, mesh: Any) -> torch.nn.Module:
    return module


# ---------------------------------------------------------------------------------------------- arguments
@pytest.mark.parametrize(
    ("kwargs", "error", "fragment"),
    [
        ({"parallelize_fn": None}, TypeError, "expected a function"),
        ({"data_parallel_size": 0}, ValueError, "data_parallel_size=0"),
        ({"tensor_parallel_size": "two"}, ValueError, "tensor_parallel_size='two'"),
        ({"data_parallel_replicate_size": 0}, ValueError, "data_parallel_replicate_size=0"),
        ({"data_parallel_size": 4, "data_parallel_replicate_size": 3}, ValueError, "divides 4"),
        ({"save_distributed_checkpoint": "yes"}, TypeError, "save_distributed_checkpoint='yes'"),
        ({"start_method": "thread"}, ValueError, "start_method='thread'"),
        ({"timeout": 5}, TypeError, "timedelta"),
    ],
)
def test_bad_arguments_raise_naming_the_value(kwargs: dict[str, Any], error: type, fragment: str) -> None:
    kwargs = {"parallelize_fn": _identity, **kwargs}
    with pytest.raises(error, match=fragment):
        ModelParallelStrategy(**kwargs)


def test_lightning_positional_order() -> None:
    strategy = ModelParallelStrategy(_identity, 2, 1, False, "gloo", timedelta(seconds=5))
    assert strategy.state_dict_type == "full" and strategy.process_group_backend == "gloo"
    assert strategy.timeout == timedelta(seconds=5)


@pytest.mark.parametrize(
    ("dp", "tp", "replicate", "world", "nodes", "shape"),
    [
        ("auto", "auto", 1, 4, 1, (1, 4)),  # Lightning: data parallel across nodes, tensor parallel within one
        ("auto", "auto", 1, 8, 2, (2, 4)),
        (2, "auto", 1, 4, 1, (2, 2)),
        ("auto", 4, 1, 8, 1, (2, 4)),
        (4, 1, 2, 4, 1, (2, 2, 1)),  # HSDP: 2 replicas of 2 shards
        (4, 2, 4, 8, 1, (4, 1, 2)),
    ],
)
def test_mesh_shapes(dp: Any, tp: Any, replicate: int, world: int, nodes: int, shape: tuple[int, ...]) -> None:
    assert _mesh_shape(dp, tp, replicate, world, nodes) == shape


@pytest.mark.parametrize(
    ("dp", "tp", "replicate", "world", "fragment"),
    [
        (2, 3, 1, 4, r"data_parallel_size \(2\) x tensor_parallel_size \(3\) must equal the world size \(4"),
        ("auto", 3, 1, 4, r"data_parallel_size \(no whole number\) x tensor_parallel_size \(3\)"),
        (4, 1, 3, 4, r"data_parallel_replicate_size \(3\) must divide data_parallel_size \(4\)"),
    ],
)
def test_mesh_sizes_that_do_not_fit_name_every_number(
    dp: Any, tp: Any, replicate: int, world: int, fragment: str
) -> None:
    with pytest.raises(ValueError, match=fragment):
        _mesh_shape(dp, tp, replicate, world, 1)


def test_sizes_are_checked_when_fabric_is_created() -> None:
    """Before any process starts: Fabric(...) itself raises."""
    with pytest.raises(ValueError, match=r"data_parallel_size \(3\) x tensor_parallel_size \(1\).*world size \(2"):
        Fabric(accelerator="cpu", devices=2, strategy=ModelParallelStrategy(_identity, 3, 1))


def test_unsupported_precision_names_the_choices() -> None:
    from fabric_lite.plugins import MixedPrecision

    choices = "32-true, bf16-mixed, bf16-true, 16-true"
    with pytest.raises(ValueError, match=rf"precision='64-true'.*{choices}"):
        Fabric(accelerator="cpu", devices=2, strategy=ModelParallelStrategy(_identity), precision="64-true")
    # float16 with a loss scaler (on the CPU, precision="16-mixed" runs as bf16-mixed, as in Lightning)
    with pytest.raises(ValueError, match=rf"precision='16-mixed'.*{choices}"):
        Fabric(
            accelerator="cpu",
            devices=2,
            strategy=ModelParallelStrategy(_identity),
            plugins=[MixedPrecision("16-mixed", "cpu")],
        )


@pytest.mark.parametrize("precision", ["32-true", "bf16-mixed", "bf16-true", "16-true"])
def test_supported_precisions_and_their_fsdp_policy(precision: str) -> None:
    fabric = Fabric(accelerator="cpu", devices=2, strategy=ModelParallelStrategy(_identity), precision=precision)
    policy = fabric.strategy.mixed_precision_policy
    expected = {"32-true": None, "bf16-mixed": torch.bfloat16, "bf16-true": torch.bfloat16, "16-true": torch.float16}
    assert policy.param_dtype == expected[precision]


def test_checkpoint_io_is_refused_and_mesh_needs_launch() -> None:
    from fabric_lite.plugins.io import TorchCheckpointIO

    with pytest.raises(NotImplementedError, match="does not support a CheckpointIO"):
        Fabric(accelerator="cpu", devices=2, strategy=ModelParallelStrategy(_identity), plugins=[TorchCheckpointIO()])
    with pytest.raises(RuntimeError, match=r"call fabric.launch\(\) first"):
        _ = ModelParallelStrategy(_identity).device_mesh


def test_plan_checks_its_names() -> None:
    with pytest.raises(ValueError, match="non-empty string"):
        TransformerPlan(attention_in=("wq", ""))
    with pytest.raises(ValueError, match="attention_inputs=0"):
        TransformerPlan(attention_inputs=0)


def test_importing_loads_no_dtensor() -> None:
    code = "import sys, fabric_lite, fabric_lite.strategies; print('torch.distributed.tensor' in sys.modules)"
    done = run_python(["-c", code], timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "False", done.output


# ---------------------------------------------------------------------------------------------- one process
def test_one_rank_helper_without_parallel_dimensions() -> None:
    """On a 1x1 mesh ``parallelize_transformer`` changes nothing, and a missing part is named."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    store = dist.HashStore()
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        mesh = init_device_mesh("cpu", (1, 1), mesh_dim_names=("data_parallel", "tensor_parallel"))
        model = Llama()
        before = {k: v.clone() for k, v in model.state_dict().items()}
        assert parallelize_transformer(model, mesh) is model
        assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
        with pytest.raises(AttributeError, match="has no blocks 'blocks'"):
            parallelize_transformer(Llama(), mesh, TransformerPlan(blocks="blocks"))
    finally:
        dist.destroy_process_group()


# ---------------------------------------------------------------------------------------------- layouts
@pytest.fixture(scope="module")
def expected() -> dict[str, Any]:
    return reference()


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("model_parallel")


@pytest.fixture(scope="module")
def two_by_two(folder: Path) -> list[dict[str, Any]]:
    """2 data-parallel x 2 tensor-parallel, sequence parallel and loss parallel; saves ``folder/sharded``."""
    return mp_job("train_then_misuse", 4, dp=2, tp=2, loss_parallel=True, kwargs={"folder": str(folder / "sharded")})


def _matches_reference(runs: list[dict[str, Any]], expected: dict[str, Any]) -> None:
    for run in runs:
        assert len(run["losses"]) == STEPS
        for mine, theirs in ((run["losses"], expected["losses"]), (run["norms"], expected["norms"])):
            assert max(abs(a - b) for a, b in zip(mine, theirs, strict=True)) < TOLERANCE, (run["rank"], mine, theirs)
        for key, value in expected["state"].items():
            torch.testing.assert_close(run["state"][key], value, atol=TOLERANCE, rtol=0, msg=key)


def test_two_by_two_equals_one_process(two_by_two: list[dict[str, Any]], expected: dict[str, Any]) -> None:
    _matches_reference([run["train"] for run in two_by_two], expected)


def test_each_rank_holds_its_fraction_of_every_parameter(two_by_two: list[dict[str, Any]]) -> None:
    for run in two_by_two:
        for name, seen in run["train"]["placements"].items():
            assert seen["mesh"] == ["data_parallel", "tensor_parallel"], name
            if "norm" in name:  # sequence parallel: replicated over tensor-parallel ranks, sharded over data-parallel
                assert seen["placements"][1] == "R" and seen["fraction"] == 0.5, (name, seen)
            else:  # projections, embedding and head: sharded by both
                assert seen["placements"][1].startswith("S(") and seen["fraction"] == 0.25, (name, seen)


def test_tensor_parallel_ranks_see_the_same_batches(two_by_two: list[dict[str, Any]]) -> None:
    runs = {run["train"]["rank"]: run["train"] for run in two_by_two}
    assert runs[0]["mesh"] == {"data_parallel": 0, "tensor_parallel": 0}
    assert runs[1]["mesh"] == {"data_parallel": 0, "tensor_parallel": 1}  # consecutive ranks share a TP group
    assert runs[0]["seen"] == runs[1]["seen"] and runs[2]["seen"] == runs[3]["seen"]
    assert not set(runs[0]["seen"]) & set(runs[2]["seen"])  # the data-parallel groups get different data
    assert [runs[r]["sampler"] for r in range(4)] == [{"num_replicas": 2, "rank": r // 2} for r in range(4)]


def test_misuse_and_group_collectives(two_by_two: list[dict[str, Any]]) -> None:
    for rank, run in enumerate(per_rank([run["misuse"] for run in two_by_two], "early_optimizer")):
        assert run["setup"]["type"] == "NotImplementedError" and "setup_module" in run["setup"]["message"], rank
        early = run["setup_optimizers"]
        assert early["type"] == "ValueError" and "created before fabric.setup_module" in early["message"], rank
    for rank, misuse in enumerate(run["misuse"] for run in two_by_two):
        assert misuse["fsdp1"]["type"] == "TypeError" and "FSDP1" in misuse["fsdp1"]["message"], rank
        assert misuse["no_sync"]["type"] == "TypeError" and "setup_module" in misuse["no_sync"]["message"], rank
        assert (
            misuse["bad_group_src"]["type"] == "ValueError" and "not in the group" in misuse["bad_group_src"]["message"]
        )
        seen = misuse["collectives"]
        assert seen["world_sum"] == 6.0  # 0 + 1 + 2 + 3
        assert seen["tp_ranks"] == [rank // 2 * 2, rank // 2 * 2 + 1] and seen["dp_ranks"] == [rank % 2, rank % 2 + 2]
        assert seen["tp_sum"] == float(sum(seen["tp_ranks"]))
        assert seen["dp_gather"] == [float(r) for r in seen["dp_ranks"]]
        assert seen["tp_broadcast"] == seen["tp_ranks"][0]


def test_parallelize_fn_must_return_the_module(tmp_path: Path) -> None:
    code = """
import torch
from fabric_lite import Fabric
from fabric_lite.strategies import ModelParallelStrategy
def parallelize(module, mesh):
    module.to(torch.float32)  # forgets to return it
fabric = Fabric(accelerator="cpu", devices=1, strategy=ModelParallelStrategy(parallelize))
fabric.launch()
try:
    fabric.setup_module(torch.nn.Linear(2, 2))
except TypeError as err:
    print("ERROR", err)
"""
    script = tmp_path / "forgets_to_return.py"
    script.write_text(code)
    done = run_python([str(script)], timeout=LAUNCH_TIMEOUT)
    assert done.returncode == 0, done.output
    assert "ERROR parallelize_fn must return the parallelised module" in done.stdout
    assert "'parallelize' returned NoneType" in done.stdout


@pytest.mark.timeout(240)
@pytest.mark.parametrize(
    "options",
    [
        {"dp": 1, "tp": 2, "sequence_parallel": False},  # TP alone, norms as plain tensors beside DTensors
        {"dp": 2, "tp": 1, "accumulate": 2, "compile": "aot_eager"},  # FSDP alone, no_backward_sync, compiled
        {"dp": 4, "tp": 1, "replicate": 2, "activation_checkpointing": True},  # HSDP: 2 replicas of 2 shards
    ],
    ids=["tp_only", "fsdp_only", "hsdp"],
)
def test_other_layouts_equal_one_process(options: dict[str, Any], expected: dict[str, Any]) -> None:
    nprocs = options["dp"] * options["tp"]
    runs = mp_job("train", nprocs, **options)
    _matches_reference(runs, expected)
    for run in runs:
        if options.get("replicate"):
            names = {tuple(seen["mesh"]) for seen in run["placements"].values()}
            assert names == {("data_parallel_replicate", "data_parallel_shard")}
            assert all(seen["fraction"] == 0.5 for seen in run["placements"].values())  # sharded in 2, replicated
        if options.get("compile"):
            assert run["compiled"] == {"wrapped": False, "blocks": 2}  # block by block, the model itself not wrapped
        if options["tp"] == 2:
            plain = [name for name, seen in run["placements"].items() if seen["placements"] is None]
            assert plain and all("norm" in name for name in plain)


# ---------------------------------------------------------------------------------------------- checkpoints
@pytest.mark.timeout(300)
@pytest.mark.parametrize(("dp", "tp"), [(1, 4), (4, 1), (1, 1)], ids=["1x4", "4x1", "one_rank"])
def test_a_2x2_checkpoint_loads_into_other_meshes(
    two_by_two: list[dict[str, Any]], folder: Path, dp: int, tp: int
) -> None:
    saved = two_by_two[0]["train"]
    assert saved["saved_files"] == [".metadata", *[f"__{r}_0.distcp" for r in range(4)], "fabric_lite.json", "meta.pt"]
    runs = mp_job("load", dp * tp, dp=dp, tp=tp, kwargs={"folder": str(folder / "sharded")})
    steps = set()
    for rank, run in enumerate(runs):
        loaded = run["loaded"]
        assert "traceback" not in loaded, loaded
        assert loaded["remainder"] == [] and loaded["step"] == STEPS, rank
        for key, value in saved["state"].items():
            assert torch.equal(loaded["state"][key], value), (rank, key)
        assert run["strict"]["type"] == "KeyError" and "['extra']" in run["strict"]["message"], rank
        assert "strict=False" in run["strict"]["message"]
        assert run["lenient"] == ["optimizer", "step"] or run["lenient"] == ["step"], run["lenient"]
        steps.add(run["step"])
    assert len(steps) == 1  # the same next loss on every rank


def test_a_2x2_checkpoint_loads_into_a_plain_module_and_consolidates(
    two_by_two: list[dict[str, Any]], folder: Path
) -> None:
    saved = two_by_two[0]["train"]["state"]
    model = Llama()
    optimizer = torch.optim.AdamW(model.parameters())
    state = {"model": model, "optimizer": optimizer, "step": 0}
    assert Fabric(accelerator="cpu", devices=1).load(folder / "sharded", state) == {}
    assert state["step"] == STEPS
    for key, value in model.state_dict().items():
        assert torch.equal(value, saved[key]), key
    assert len(optimizer.state_dict()["state"]) == len(list(model.parameters()))  # Adam's moments came back
    target = folder / "consolidated.pt"
    done = run_python(["-m", "fabric_lite.utilities.consolidate", str(folder / "sharded"), str(target)], timeout=60)
    assert done.returncode == 0, done.output
    full = torch.load(target, weights_only=True)
    assert full["step"] == STEPS
    for key, value in saved.items():
        assert torch.equal(full["model"][key], value), key


@pytest.mark.timeout(240)
def test_full_checkpoint_file(tmp_path: Path) -> None:
    """``save_distributed_checkpoint=False``: one file from rank 0, the same layout a plain module loads."""
    target = tmp_path / "full.ckpt"
    runs = mp_job("train", 2, dp=1, tp=2, save_distributed_checkpoint=False, kwargs={"folder": str(target), "steps": 2})
    assert target.is_file() and runs[0]["saved_files"] == "file"
    model = Llama()
    Fabric(accelerator="cpu", devices=1).load(target, {"model": model}, strict=False)
    for key, value in runs[0]["state"].items():
        assert torch.equal(model.state_dict()[key], value), key


def test_helper_is_a_parallelize_fn() -> None:
    strategy = ModelParallelStrategy(partial(parallelize_transformer, loss_parallel=True))
    assert "partial" in repr(strategy) or "parallelize_fn" in repr(strategy)


@pytest.mark.compat
@pytest.mark.timeout(300)
@pytest.mark.skipif(lightning_python() is None, reason="no Lightning Fabric venv: run .ci/setup")
@pytest.mark.parametrize(("writer", "reader"), [("lightning", "fabric_lite"), ("fabric_lite", "lightning")])
def test_checkpoints_load_across_lightning_and_fabric_lite(writer: str, reader: str, tmp_path: Path) -> None:
    """A folder saved by one implementation loads in the other: the same DCP layout, and Lightning's ``meta.pt``
    for the entries that are not modules or optimizers (fabric_lite reads and writes it)."""
    script = "tests/scripts/model_parallel_compat.py"
    observed = {}
    for impl, mode in ((writer, "save"), (reader, "load")):
        python = lightning_python() if impl == "lightning" else None
        env = base_env({"COMPAT_IMPL": impl})
        done = run_python([script, mode, str(tmp_path / "ckpt")], timeout=150, env=env, python=python)
        assert done.returncode == 0, done.output
        observed[mode] = json.loads(next(line[4:] for line in done.stdout.splitlines() if line.startswith("OBS ")))
    assert observed["load"] == observed["save"]  # weights after one more step, "step" and "note" alike
    assert observed["load"]["step"] == 3 and observed["load"]["note"] == "hello"


@pytest.mark.timeout(240)
def test_bf16_mixed_trains_close_to_float32(expected: dict[str, Any]) -> None:
    """``bf16-mixed``: autocast around the tensor-parallel forward, float32 parameters; the losses follow float32's
    within bfloat16's precision (a relative 2**-8 per operation)."""
    runs = mp_job("train", 2, dp=1, tp=2, precision="bf16-mixed", kwargs={"steps": 4})
    for run in runs:
        assert all(dtype == "torch.float32" for dtype in run["dtypes"]), run["dtypes"]
        differences = [abs(a - b) for a, b in zip(run["losses"], expected["losses"][:4], strict=True)]
        assert max(differences) < 0.05, (run["losses"], expected["losses"][:4])
        assert max(differences) > 0, "bf16-mixed computed in float32"
