"""ModelParallelStrategy: tensor, sequence and sharded data parallelism (and HSDP) on a DeviceMesh.

Arguments, the mesh arithmetic, the optimizer's foreach rule and compiled blocks fed by a tensor-parallel layer are
checked without processes. The rest runs on real gloo process groups of 1, 2 and 4 CPU ranks through fabric_lite's own
script launcher (tests/helpers/jobs/model_parallel_jobs.py): every 4-rank job in one launch and every 2-rank job in
another, each job a Fabric of its own layout that joins the running processes. With a tiny two-block Llama-style model:
losses over 10 steps equal one process over the global batch in every layout (compiled block by block on 2x2 and 2x1),
each rank holds the expected fraction of every parameter, the ranks of a tensor-parallel group see the same batches,
``no_backward_sync`` really skips the reduce-scatter, checkpointed blocks really run again in backward, and a checkpoint
saved on 2x2 loads on 1x4, 4x1, one rank, a plain module and through the consolidation command.

Pipelines run in the same two launches: PP=2 x DP=2 (GPipe), PP=2 x TP=2 (1F1B) and PP=2 alone under every schedule
(the multi-stage ones with four blocks, two stages per rank) train as one process does; a PP=2 checkpoint loads back on
PP=2, without a pipeline, into a plain module and through consolidation; and a pipelined model refuses what it cannot
do (its arguments and the mesh arithmetic are checked without processes, in tests/unit/test_pipeline.py).
"""

from __future__ import annotations

import json
import math
from datetime import timedelta
from functools import cache, partial
from pathlib import Path
from typing import Any

import pytest
import torch

from fabric_lite import Fabric
from fabric_lite.strategies import ModelParallelStrategy
from fabric_lite.strategies._model_parallel_ops import mesh_shape as _mesh_shape
from fabric_lite.strategies.parallelize import TransformerPlan, parallelize_transformer
from tests.helpers.harness import base_env, lightning_python, per_rank, run_job, run_python, series_job
from tests.helpers.jobs.model_parallel_jobs import DEPTH, STEPS, Llama, mlp_reference, reference

#: the pipelines trained on 2 ranks besides 1F1B: every multi-stage schedule, with four blocks (two stages per rank),
#: and the steps each trains
SCHEDULES = {"Interleaved1F1B": STEPS, "ZBVZeroBubble": STEPS, "LoopedBFS": 3, "InterleavedZeroBubble": 3,
             "DualPipeV": 3}  # fmt: skip

LAUNCH_TIMEOUT = 180  # seconds for one launch of 1-4 ranks on a loaded 2-core machine (~20 s when quiet)
TOLERANCE = 1e-5


def mp_job(job: str, nprocs: int, **options: Any) -> list[Any]:
    """Run ``tests.helpers.jobs.model_parallel_jobs.<job>`` on ``nprocs`` ranks; every rank's result."""
    return run_job(  # type: ignore[no-any-return]
        ["-m", "tests.helpers.jobs.model_parallel_jobs", job, str(nprocs), json.dumps(options)], LAUNCH_TIMEOUT
    )


def mp_series(nprocs: int, jobs: dict[str, dict[str, Any]]) -> dict[str, list[Any]]:
    """Run several jobs (name: options with the ``job``) one after another in one launch of ``nprocs`` ranks, each
    with a Fabric of its own layout; every rank's result of each, by name."""
    return series_job("tests.helpers.jobs.model_parallel_jobs", nprocs, jobs, LAUNCH_TIMEOUT * len(jobs))


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
        (
            2,
            3,
            1,
            4,
            r"data_parallel_size \(2\) and tensor_parallel_size \(3\) multiplied should equal the world size \(4"
            r" = 1 node\(s\) x 4 device\(s\)\), not 6",
        ),
        ("auto", 3, 1, 4, r"data_parallel_size \(no whole number\) and tensor_parallel_size \(3\)"),
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
    with pytest.raises(ValueError, match=r"data_parallel_size \(3\) and tensor_parallel_size \(1\).*world size \(2"):
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

    with pytest.raises(NotImplementedError, match="does not support setting a `CheckpointIO`"):
        Fabric(accelerator="cpu", devices=2, strategy=ModelParallelStrategy(_identity), plugins=[TorchCheckpointIO()])
    with pytest.raises(RuntimeError, match=r"before the processes have initialized is not allowed.*fabric.launch\(\)"):
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


@pytest.fixture
def one_rank_mesh() -> Any:
    """A 1-rank gloo world in this process (a hash store, no port) and its 1-D mesh; destroyed afterwards."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield init_device_mesh("cpu", (1,), mesh_dim_names=("tensor_parallel",))
    finally:
        dist.destroy_process_group()


def test_foreach_is_settled_per_group_of_mixed_parameters(one_rank_mesh: Any) -> None:
    """torch's foreach and fused kernels refuse a group of DTensors and plain tensors (a TP model without sequence
    parallelism): foreach=None becomes False there; True is refused, naming the group and the fix."""
    from torch.distributed.tensor import Shard, distribute_tensor

    from fabric_lite.strategies._model_parallel_ops import settle_foreach

    def params() -> tuple[torch.nn.Parameter, torch.nn.Parameter]:
        weight = torch.nn.Parameter(distribute_tensor(torch.randn(4, 4), one_rank_mesh, [Shard(0)]))
        return weight, torch.nn.Parameter(torch.randn(4))

    (weight, norm), (other, _) = params(), params()
    names = {id(weight): "layer.weight", id(norm): "norm.weight"}
    optimizer = torch.optim.AdamW([{"params": [other]}, {"params": [weight, norm]}], lr=0.1)
    settle_foreach(optimizer, names)
    assert [group["foreach"] for group in optimizer.param_groups] == [None, False]  # only the mixed group
    for param in (weight, norm):
        param.grad = torch.ones_like(param)
    optimizer.step()  # the per-parameter loop takes the mix
    for option in ("foreach", "fused"):
        mixed = torch.optim.AdamW([{"params": [other]}, {"params": [weight, norm]}], lr=0.1, **{option: True})
        with pytest.raises(ValueError, match=rf"AdamW\({option}=True\): parameter group 1 mixes 1 DTensor") as info:
            settle_foreach(mixed, names)
        assert "(norm.weight)" in str(info.value) and f"Pass {option}=False" in str(info.value)
        assert "sequence_parallel=True" in str(info.value)


def test_a_compiled_block_passes_the_gradient_to_an_async_collective_input() -> None:
    """A tensor-parallel layer run eagerly before a compiled block (the embedding, sequence-parallel) hands it an
    ``AsyncCollectiveTensor``; torch 2.13 compiles it as an input without gradient, so the embedding would learn
    nothing. ``compile_in_place`` waits on it first and passes the gradient back."""
    from torch.distributed._functional_collectives import AsyncCollectiveTensor

    from fabric_lite._compile import Compiler

    class ToLocal(torch.autograd.Function):  # what DTensor.to_local() returns after a functional collective
        @staticmethod
        def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
            return AsyncCollectiveTensor(x.detach().clone())

        @staticmethod
        def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
            return grad

    class Square(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return (x * x).sum()

    block = Square()
    Compiler(torch.compile(torch.nn.Identity(), backend="aot_eager").dynamo_ctx).compile_in_place(block)
    x = torch.arange(3.0, requires_grad=True)
    block(ToLocal.apply(x)).backward()
    assert x.grad is not None and x.grad.tolist() == [0.0, 2.0, 4.0]


# ---------------------------------------------------------------------------------------------- layouts
@pytest.fixture(scope="module")
def expected() -> dict[str, Any]:
    return reference()


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("model_parallel")


#: the layouts besides 2x2 that train as one process does, each with what it shows
LAYOUTS: dict[str, dict[str, Any]] = {
    # TP alone, norms as plain tensors beside DTensors: foreach=None settled to False; compiled (no fully_shard units,
    # so the model as a whole)
    "tp_only": {"dp": 1, "tp": 2, "sequence_parallel": False, "compile": "aot_eager", "foreach": None,
                "foreach_errors": True},
    "fsdp_only": {"dp": 2, "tp": 1, "accumulate": 2, "compile": "aot_eager"},  # FSDP alone, no_backward_sync, compiled
    "hsdp": {"dp": 4, "tp": 1, "replicate": 2, "activation_checkpointing": True},  # HSDP: 2 replicas of 2 shards
    "hsdp_tp": {"dp": 2, "tp": 2, "replicate": 2},  # HSDP with TP, a 3-D mesh: 2 replicas x 1 shard x 2 tensor-parallel
}  # fmt: skip


@pytest.fixture(scope="module")
def four_ranks(folder: Path) -> dict[str, list[Any]]:
    """Every 4-rank job, in one launch (each job a Fabric of its own over the same ranks), in this order:

    * ``two_by_two``: 2 data-parallel x 2 tensor-parallel, sequence parallel and loss parallel, compiled block by
      block; saves ``folder/sharded``, then the misuse checks;
    * ``hsdp`` and ``hsdp_tp`` from :data:`LAYOUTS`;
    * ``bf16_mixed``: 2x2 in ``bf16-mixed`` with ``mp_policy=strategy.mixed_precision_policy``, 4 steps;
    * ``load_1x4`` and ``load_4x1``: the 2x2 checkpoint loaded on other meshes;
    * ``pp_dp``: 2 pipeline stages x 2 data-parallel (GPipe, 4 micro-batches), ``pp_tp``: 2 stages x 2
      tensor-parallel (1F1B, 2 micro-batches, without sequence parallelism).
    """
    sharded = str(folder / "sharded")
    jobs = {
        "two_by_two": {"job": "train_then_misuse", "dp": 2, "tp": 2, "loss_parallel": True, "compile": "aot_eager",
                       "kwargs": {"folder": sharded}},
        **{name: {"job": "train", **LAYOUTS[name]} for name in ("hsdp", "hsdp_tp")},
        "bf16_mixed": {"job": "train", "dp": 2, "tp": 2, "precision": "bf16-mixed", "mp_policy": True,
                       "kwargs": {"steps": 4}},
        "load_1x4": {"job": "load", "dp": 1, "tp": 4, "kwargs": {"folder": sharded}},
        "load_4x1": {"job": "load", "dp": 4, "tp": 1, "kwargs": {"folder": sharded}},
        "pp_dp": {"job": "pipeline_train", "pp": 2, "dp": 2, "tp": 1, "schedule": "GPipe", "microbatches": 4},
        "pp_tp": {"job": "pipeline_train", "pp": 2, "dp": 1, "tp": 2, "schedule": "1F1B", "microbatches": 2,
                  "sequence_parallel": False},
    }  # fmt: skip
    return mp_series(4, jobs)


@pytest.fixture(scope="module")
def two_ranks(folder: Path) -> dict[str, list[Any]]:
    """Every 2-rank job, in one launch: ``tp_only`` and ``fsdp_only`` from :data:`LAYOUTS`; ``bf16_true`` (2x1 with
    the strategy's policy, 2 steps); ``full_checkpoint`` (1x2, ``save_distributed_checkpoint=False`` into
    ``folder/full.ckpt``, 2 steps, then loaded back into a freshly parallelised model); ``1F1B`` (2 pipeline stages,
    saved into ``folder/pipelined`` and loaded back, then the misuses), each of :data:`SCHEDULES`,
    ``interleaved_saved`` (two stages per rank, 2 steps, saved into ``folder/interleaved`` and loaded back),
    ``load_pipelined`` (that checkpoint on a 1x2 mesh without a pipeline), ``mlp_split`` (a residual MLP split by a
    ``split_fn`` written by hand) and ``pp_bf16_mixed`` (2 stages in ``bf16-mixed``, 4 steps)."""
    jobs = {
        **{name: {"job": "train", **LAYOUTS[name]} for name in ("tp_only", "fsdp_only")},
        "bf16_true": {"job": "train", "dp": 2, "tp": 1, "precision": "bf16-true", "mp_policy": True,
                      "kwargs": {"steps": 2}},
        "full_checkpoint": {"job": "train", "dp": 1, "tp": 2, "save_distributed_checkpoint": False,
                            "kwargs": {"folder": str(folder / "full.ckpt"), "steps": 2, "reload": True}},
        "1F1B": {"job": "pipeline_train", "pp": 2, "schedule": "1F1B", "microbatches": 4,
                 "kwargs": {"folder": str(folder / "pipelined"), "misuse": True}},
        **{schedule: {"job": "pipeline_train", "pp": 2, "schedule": schedule, "microbatches": 4, "depth": 4,
                      "kwargs": {"steps": steps}} for schedule, steps in SCHEDULES.items()},
        "interleaved_saved": {"job": "pipeline_train", "pp": 2, "schedule": "Interleaved1F1B", "microbatches": 4,
                              "depth": 4, "kwargs": {"steps": 2, "folder": str(folder / "interleaved")}},
        "load_pipelined": {"job": "load", "dp": 1, "tp": 2, "kwargs": {"folder": str(folder / "pipelined")}},
        "mlp_split": {"job": "mlp_pipeline_train", "pp": 2, "schedule": "GPipe", "microbatches": 4, "split": "mlp"},
        "pp_bf16_mixed": {"job": "pipeline_train", "pp": 2, "schedule": "1F1B", "microbatches": 4,
                          "precision": "bf16-mixed", "kwargs": {"steps": 4}},
    }  # fmt: skip
    return mp_series(2, jobs)


@pytest.fixture(scope="module")
def two_by_two(four_ranks: dict[str, list[Any]]) -> list[dict[str, Any]]:
    return four_ranks["two_by_two"]


def _matches_reference(runs: list[dict[str, Any]], expected: dict[str, Any]) -> None:
    for run in runs:
        assert len(run["losses"]) == STEPS
        for mine, theirs in ((run["losses"], expected["losses"]), (run["norms"], expected["norms"])):
            assert max(abs(a - b) for a, b in zip(mine, theirs, strict=True)) < TOLERANCE, (run["rank"], mine, theirs)
        for key, value in expected["state"].items():
            torch.testing.assert_close(run["state"][key], value, atol=TOLERANCE, rtol=0, msg=key)


def test_two_by_two_equals_one_process(two_by_two: list[dict[str, Any]], expected: dict[str, Any]) -> None:
    """Compiled too: the embedding's gradient crosses into the first compiled block (see the unit test above)."""
    _matches_reference([run["train"] for run in two_by_two], expected)
    for run in two_by_two:
        assert run["train"]["compiled"] == {"wrapped": False, "blocks": 2}  # each block's fully_shard unit


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


def test_setup_with_an_optimizer_trains_as_an_optimizer_created_after_setup(
    two_by_two: list[dict[str, Any]],
) -> None:
    for rank, run in enumerate(per_rank([run["misuse"] for run in two_by_two], "joint_setup")):
        assert run["joint"]["losses"] == run["separate"]["losses"], rank
        assert run["joint"]["local"] == run["separate"]["local"], rank  # every shard, after two steps


def test_misuse_and_group_collectives(two_by_two: list[dict[str, Any]]) -> None:
    for rank, run in enumerate(per_rank([run["misuse"] for run in two_by_two], "early_optimizer")):
        stepped = run["setup_stepped"]
        assert stepped["type"] == "ValueError" and "already holds state" in stepped["message"], rank
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


def test_a_failed_sharded_save_keeps_the_previous_checkpoint(two_by_two: list[dict[str, Any]], folder: Path) -> None:
    """An object that fails to pickle on one rank: every rank raises, the previous folder stays as it was."""
    for rank, run in enumerate(per_rank([run["misuse"] for run in two_by_two], "replace_and_fail")):
        failure = run["failure"]
        assert failure["type"] == "CheckpointError", (rank, failure)
        assert str(folder / "replaced") in failure["message"] and "refuses to be pickled" in failure["message"]
        assert run["step"] == 2 and run["previous_intact"], rank
        before, after = run["files"]
        assert before == after == [".metadata", *[f"__{r}_0.distcp" for r in range(4)], "fabric_lite.json", "meta.pt"]
        assert run["leftovers"] == []  # no temporary folder beside it
        assert run["after"] == 4.0  # every rank still in step


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
    assert "ERROR The `parallelize_fn` must return a `nn.Module` instance, but got: NoneType" in done.stdout
    assert "'parallelize' must return the parallelised module" in done.stdout


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_other_layouts_equal_one_process(
    name: str, four_ranks: dict[str, list[Any]], two_ranks: dict[str, list[Any]], expected: dict[str, Any]
) -> None:
    options = LAYOUTS[name]
    runs = (four_ranks if options["dp"] * options["tp"] == 4 else two_ranks)[name]
    _matches_reference(runs, expected)
    for run in runs:
        if options.get("replicate") and options["tp"] == 1:
            names = {tuple(seen["mesh"]) for seen in run["placements"].values()}
            assert names == {("data_parallel_replicate", "data_parallel_shard")}
            assert all(seen["fraction"] == 0.5 for seen in run["placements"].values())  # sharded in 2, replicated
        if options.get("compile"):
            # block by block, the model itself not wrapped; TP alone has no fully_shard units: the whole model
            assert run["compiled"] == {"wrapped": False, "blocks": 2 if options["dp"] > 1 else 1}
        else:  # each block's MLP runs once per step, and again in backward where the block is checkpointed
            assert run["block_calls"] == [DEPTH * (2 if options.get("activation_checkpointing") else 1)] * STEPS
        if options["tp"] == 2 and not options.get("sequence_parallel", True):
            plain = [name for name, seen in run["placements"].items() if seen["placements"] is None]
            assert plain and all("norm" in name for name in plain)
            assert run["foreach"] == [False]  # AdamW(foreach=None), settled for the mixed group; and it trained
            for option, error in run["foreach_errors"].items():
                assert error["type"] == "ValueError", (option, error)
                assert (
                    f"AdamW({option}=True): parameter group 0 mixes 16 DTensor parameter(s) with 5 plain"
                    in (error["message"])
                )
                assert "layers.0.attention_norm.weight" in error["message"]
        if options.get("accumulate"):
            _skips_the_reduce_scatter(run["no_sync"])
    if options.get("replicate") and options["tp"] == 2:
        _is_hsdp_with_tensor_parallel(runs)


def _skips_the_reduce_scatter(seen: dict[str, Any]) -> None:
    """Two micro-batches per step, the first inside ``no_backward_sync``: no reduce-scatter there and every unit's
    gradient sync off; one reduce-scatter per unit (2 blocks and the root) after the second; nested blocks leave
    the sync off until the outermost ends."""
    units = DEPTH + 1
    assert seen["reduce_scatters"] == [0, units] * STEPS
    assert seen["inside"] == [[False] * units, [True] * units] * STEPS  # the second micro-batch: enabled=False
    assert seen["after"] == [[True] * units] * 2 * STEPS
    assert seen["nested_inner"] == seen["nested_after_inner"] == [False] * units
    assert seen["nested_after_outer"] == [True] * units


def _is_hsdp_with_tensor_parallel(runs: list[dict[str, Any]]) -> None:
    """The mesh is (replicate 2, shard 1, tensor parallel 2); parameters are replicated over the first dimension,
    sharded by FSDP over the second and by TP over the third; the replicas hold equal shards after training and saw
    different data, the ranks of a TP group the same."""
    names = ["data_parallel_replicate", "data_parallel_shard", "tensor_parallel"]
    for run in runs:
        assert run["mesh_shape"] == {"names": names, "shape": [2, 1, 2]}
        for name, seen in run["placements"].items():
            assert seen["mesh"] == names, name
            assert seen["placements"][0] == "R", (name, seen)  # replicated over the replicas
            if "norm" in name:  # sequence parallel: replicated over tensor-parallel ranks
                assert seen["placements"][2] == "R" and seen["fraction"] == 1.0, (name, seen)
            else:
                assert seen["placements"][2].startswith("S(") and seen["fraction"] == 0.5, (name, seen)
    by_rank = {run["rank"]: run for run in runs}
    for rank, replica in ((0, 2), (1, 3)):
        assert by_rank[rank]["local"] == by_rank[replica]["local"]  # the same shards in both replicas
        assert not set(by_rank[rank]["seen"]) & set(by_rank[replica]["seen"])
    assert by_rank[0]["local"] != by_rank[1]["local"] and by_rank[0]["seen"] == by_rank[1]["seen"]


# ---------------------------------------------------------------------------------------------- checkpoints
@pytest.mark.parametrize("mesh", ["1x4", "4x1", "one_rank"])
def test_a_2x2_checkpoint_loads_into_other_meshes(
    two_by_two: list[dict[str, Any]], four_ranks: dict[str, list[Any]], folder: Path, mesh: str
) -> None:
    saved = two_by_two[0]["train"]
    assert saved["saved_files"] == [".metadata", *[f"__{r}_0.distcp" for r in range(4)], "fabric_lite.json", "meta.pt"]
    if mesh == "one_rank":
        runs = mp_job("load", 1, dp=1, tp=1, kwargs={"folder": str(folder / "sharded")})
    else:  # loaded in the same launch, after the save
        runs = four_ranks[f"load_{mesh}"]
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


def test_full_checkpoint_file(two_ranks: dict[str, list[Any]], folder: Path) -> None:
    """``save_distributed_checkpoint=False``: one file from rank 0, the same layout a plain module loads, and that
    loads back into a freshly parallelised model (1x2) exactly."""
    target = folder / "full.ckpt"
    runs = two_ranks["full_checkpoint"]
    assert target.is_file() and runs[0]["saved_files"] == "file"
    model = Llama()
    Fabric(accelerator="cpu", devices=1).load(target, {"model": model}, strict=False)
    for key, value in runs[0]["state"].items():
        assert torch.equal(model.state_dict()[key], value), key
    for run in runs:
        reloaded = run["reloaded"]
        assert reloaded["remainder"] == [] and reloaded["step"] == 2 and reloaded["optimizer_steps"] == [2]
        assert all(seen["placements"] is not None for seen in reloaded["placements"].values())  # all DTensors
        for key, value in run["state"].items():
            assert torch.equal(reloaded["state"][key], value), (run["rank"], key)


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
    script = "tests/helpers/scripts/model_parallel_compat.py"
    observed = {}
    for impl, mode in ((writer, "save"), (reader, "load")):
        python = lightning_python() if impl == "lightning" else None
        env = base_env({"COMPAT_IMPL": impl})
        done = run_python([script, mode, str(tmp_path / "ckpt")], timeout=150, env=env, python=python)
        assert done.returncode == 0, done.output
        observed[mode] = json.loads(next(line[4:] for line in done.stdout.splitlines() if line.startswith("OBS ")))
    assert observed["load"] == observed["save"]  # weights after one more step, "step" and "note" alike
    assert observed["load"]["step"] == 3 and observed["load"]["note"] == "hello"


def test_bf16_mixed_trains_close_to_float32(four_ranks: dict[str, list[Any]], expected: dict[str, Any]) -> None:
    """``bf16-mixed`` on 2x2 with ``mp_policy=strategy.mixed_precision_policy``: autocast around the tensor-parallel
    forward, float32 sharded parameters that FSDP2 gathers in bfloat16; the losses follow float32's within
    bfloat16's precision (a relative 2**-8 per operation)."""
    for run in four_ranks["bf16_mixed"]:
        assert run["dtypes"] == ["torch.float32"], run["dtypes"]  # the sharded parameters, which AdamW updates
        assert run["forward_dtypes"] == ["torch.bfloat16"]  # the gathered ones, while a block runs
        differences = [abs(a - b) for a, b in zip(run["losses"], expected["losses"][:4], strict=True)]
        assert max(differences) < 0.05, (run["losses"], expected["losses"][:4])
        assert max(differences) > 0, "bf16-mixed computed in float32"


def test_bf16_true_trains_in_bfloat16(two_ranks: dict[str, list[Any]], expected: dict[str, Any]) -> None:
    """``bf16-true`` on 2x1 with the strategy's policy: parameters created, gathered and updated in bfloat16."""
    for run in two_ranks["bf16_true"]:
        assert run["dtypes"] == run["forward_dtypes"] == ["torch.bfloat16"]
        assert len(run["losses"]) == 2 and all(math.isfinite(loss) for loss in run["losses"] + run["norms"])
        differences = [abs(a - b) for a, b in zip(run["losses"], expected["losses"][:2], strict=True)]
        assert max(differences) < 0.05, (run["losses"], expected["losses"][:2])


# ---------------------------------------------------------------------------------------------- pipelines
def _whole(runs: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
    """The model's full state from every rank's stages (the ranks of a stage hold the same full values)."""
    return {key: value for run in runs for key, value in run["state"].items()}


@cache
def _reference(steps: int, depth: int, microbatches: int = 1) -> dict[str, Any]:
    """:func:`reference`, computed once per arguments: several schedules compare with the same one."""
    return reference(steps, depth, microbatches)


#: how many parts of the global batch each pipeline's gradient is accumulated over: its micro-batches times its
#: data-parallel ranks
ACCUMULATED = {"pp_dp": 8, "pp_tp": 2, "1F1B": 4, **dict.fromkeys(SCHEDULES, 4)}


@pytest.mark.parametrize("name", ["pp_dp", "pp_tp", "1F1B", *SCHEDULES])
def test_pipelines_equal_one_process(
    name: str, four_ranks: dict[str, list[Any]], two_ranks: dict[str, list[Any]], expected: dict[str, Any]
) -> None:
    """Losses and clipped norms (over every stage's gradients) as one process over the global batch; the weights as
    one process that accumulates the gradient over the same micro-batches (over ten AdamW steps the other order of
    the sum moves a few weights by up to 2e-5 from the whole-batch run)."""
    runs = four_ranks[name] if name.startswith("pp_") else two_ranks[name]
    steps, depth = SCHEDULES.get(name, STEPS), 4 if name in SCHEDULES else DEPTH
    whole_batch = _reference(steps, depth) if name in SCHEDULES else expected
    for run in runs:
        assert "traceback" not in run, run
        for mine, theirs in ((run["losses"], whole_batch["losses"]), (run["norms"], whole_batch["norms"])):
            assert max(abs(a - b) for a, b in zip(mine, theirs, strict=True)) < TOLERANCE, (name, mine, theirs)
    whole = _whole(runs)
    accumulated = _reference(steps, depth, ACCUMULATED[name])["state"]
    assert sorted(whole) == sorted(accumulated)
    for key, value in accumulated.items():
        torch.testing.assert_close(whole[key], value, atol=TOLERANCE, rtol=0)
    if name in SCHEDULES:  # two stages per rank, as one module with the model's names
        assert {run["module"] for run in runs} == {"RankStages"}


def test_pipeline_stages_hold_their_layers_and_share_batches(four_ranks: dict[str, list[Any]]) -> None:
    """PP=2 x DP=2: the pipeline dimension is outermost, so ranks 0-1 run stage 0 (embedding, first block) and 2-3
    stage 1 (last block, norm, output); the ranks of a pipeline get the same batches, its two replicas others, and
    each stage is sharded over its data-parallel pair."""
    runs = {run["rank"]: run for run in four_ranks["pp_dp"]}
    for rank, run in runs.items():
        assert run["mesh_shape"] == {
            "names": ["pipeline_parallel", "data_parallel", "tensor_parallel"],
            "shape": [2, 2, 1],
        }
        assert run["mesh"]["pipeline_parallel"] == rank // 2 and run["mesh"]["data_parallel"] == rank % 2
        layers = {
            name.split(".")[0] + ("." + name.split(".")[1] if name.startswith("layers") else "")
            for name in run["state"]
        }
        assert layers == ({"tok_embeddings", "layers.0"} if rank < 2 else {"layers.1", "norm", "output"}), rank
        assert all(seen["fraction"] == 0.5 for seen in run["placements"].values()), rank
    assert runs[0]["seen"] == runs[2]["seen"] and runs[1]["seen"] == runs[3]["seen"]
    assert not set(runs[0]["seen"]) & set(runs[1]["seen"])
    for run in four_ranks["pp_tp"]:  # the stage's projections sharded over its tensor-parallel pair
        assert run["mesh_shape"]["shape"] == [2, 1, 2]
        assert any(seen["fraction"] == 0.5 for seen in run["placements"].values())


def test_a_pipelined_checkpoint_loads_back_and_without_a_pipeline(
    two_ranks: dict[str, list[Any]], folder: Path
) -> None:
    """PP=2 saves the sharded layout of the other strategies: it loads back on PP=2 (weights, step, optimizer state
    that steps on exactly as the trained one), on a 1x2 mesh without a pipeline, and into a plain module."""
    runs = two_ranks["1F1B"]
    whole = _whole(runs)
    files = sorted(p.name for p in (folder / "pipelined").iterdir())
    assert files == [".metadata", "__0_0.distcp", "__1_0.distcp", "fabric_lite.json", "meta.pt"]
    for run in runs:
        reloaded = run["reloaded"]
        assert reloaded["remainder"] == [] and reloaded["step"] == STEPS and reloaded["optimizer_steps"] == [STEPS]
        assert reloaded["state"].keys() == run["state"].keys()
        for key, value in run["state"].items():
            assert torch.equal(reloaded["state"][key], value), (run["rank"], key)
        assert reloaded["next"][0] == reloaded["next"][1] and reloaded["next_equal"], reloaded["next"]
    for rank, run in enumerate(two_ranks["load_pipelined"]):
        loaded = run["loaded"]
        assert "traceback" not in loaded, loaded
        assert loaded["remainder"] == [] and loaded["step"] == STEPS, rank
        for key, value in whole.items():
            assert torch.equal(loaded["state"][key], value), (rank, key)
    model = Llama()
    optimizer = torch.optim.AdamW(model.parameters())
    state = {"model": model, "optimizer": optimizer, "step": 0}
    assert Fabric(accelerator="cpu", devices=1).load(folder / "pipelined", state) == {}
    assert state["step"] == STEPS and len(optimizer.state_dict()["state"]) == len(list(model.parameters()))
    for key, value in model.state_dict().items():
        assert torch.equal(value, whole[key]), key


def test_a_checkpoint_of_two_stages_per_rank_loads_back_and_into_a_plain_module(
    two_ranks: dict[str, list[Any]], folder: Path
) -> None:
    """Interleaved1F1B: each rank's two stages are one module with the model's names, saved in the same layout, and
    loaded back exactly (weights, step, optimizer state that steps on as the trained one) and into a plain module."""
    runs = two_ranks["interleaved_saved"]
    for run in runs:
        assert "traceback" not in run, run
        assert run["module"] == "RankStages"
        reloaded = run["reloaded"]
        assert reloaded["remainder"] == [] and reloaded["step"] == 2 and reloaded["optimizer_steps"] == [2]
        for key, value in run["state"].items():
            assert torch.equal(reloaded["state"][key], value), (run["rank"], key)
        assert reloaded["next"][0] == reloaded["next"][1] and reloaded["next_equal"], reloaded["next"]
    whole = _whole(runs)
    model = Llama(depth=4)
    assert Fabric(accelerator="cpu", devices=1).load(folder / "interleaved", {"model": model}, strict=False) == {
        "step": 2
    }
    assert sorted(model.state_dict()) == sorted(whole)
    for key, value in model.state_dict().items():
        assert torch.equal(value, whole[key]), key


def test_a_pipelined_checkpoint_consolidates(two_ranks: dict[str, list[Any]], folder: Path) -> None:
    """One file with every stage's weights, and one optimizer parameter group naming every parameter: a plain model
    and optimizer load it."""
    from fabric_lite.utilities.consolidate_checkpoint import consolidate_checkpoint

    whole = _whole(two_ranks["1F1B"])
    target = folder / "pipelined.ckpt"
    consolidate_checkpoint(folder / "pipelined", target)
    full = torch.load(target, weights_only=True)
    model = Llama()
    model.load_state_dict(full["model"])
    for key, value in whole.items():
        assert torch.equal(model.state_dict()[key], value), key
    names = [name for name, _ in model.named_parameters()]
    assert [group["params"] for group in full["optimizer"]["param_groups"]] == [names]
    assert full["step"] == STEPS


def test_a_pipelined_model_refuses_what_it_cannot_do(two_ranks: dict[str, list[Any]]) -> None:
    """Under ``torch.no_grad()`` a step runs the forward only (no gradient, no update) and gives every rank the same
    loss; each thing a pipelined model cannot do raises, naming the fix."""
    misuses = [run["misuse"] for run in two_ranks["1F1B"]]
    evaluations = per_rank(misuses, "evaluate")
    for rank, seen in enumerate(evaluations):
        assert seen["unchanged"] and seen["grads"], rank
    assert evaluations[0]["loss"] == evaluations[1]["loss"]
    expected = {
        "backward": ("RuntimeError", "already ran backward over every micro-batch"),
        "direct_call": ("RuntimeError", "fabric.pipeline_step(model, inputs, target=..., loss_fn=...)"),
        "no_backward_sync": ("RuntimeError", "raise ModelParallelStrategy(pipeline_microbatches=...)"),
        "indivisible": ("ValueError", "args[0] has 6 samples, which pipeline_microbatches=4 does not divide"),
        "compiled": ("TypeError", "compile the blocks in parallelize_fn"),
    }
    for check, (kind, fragment) in expected.items():
        for rank, seen in enumerate(per_rank(misuses, check)):
            assert seen["type"] == kind and fragment in seen["message"], (rank, check, seen)


def test_a_split_fn_written_by_hand_trains_as_one_process(two_ranks: dict[str, list[Any]]) -> None:
    """The manual route for any model: a residual MLP whose ``split_fn`` gives each stage the model's own blocks under
    their names, GPipe over 4 micro-batches: the losses and weights of one process accumulating over the same
    micro-batches; a ``split_fn`` that returns one module too many is refused, naming the stages."""
    runs = two_ranks["mlp_split"]
    expected = mlp_reference(STEPS, microbatches=4)
    for run in runs:
        assert "traceback" not in run, run
        assert max(abs(a - b) for a, b in zip(run["losses"], expected["losses"], strict=True)) < TOLERANCE
    whole = _whole(runs)
    assert sorted(whole) == sorted(expected["state"])  # blocks.0-1 on stage 0, blocks.2-3 and the head on stage 1
    for key, value in expected["state"].items():
        torch.testing.assert_close(whole[key], value, atol=TOLERANCE, rtol=0)
    for rank, run in enumerate(runs):
        error = run["wrong_split"]
        assert error["type"] == "TypeError", error
        assert (
            f"returned list of 2; expected a list of 1 module(s), one for each stage index in [{rank}] (of 2)"
            in (error["message"])
        )


def test_a_pipeline_trains_in_bf16_mixed(two_ranks: dict[str, list[Any]], expected: dict[str, Any]) -> None:
    """``bf16-mixed`` with 2 stages: autocast around each stage's forward; the losses follow float32's within
    bfloat16's precision, and the parameters AdamW updates stay float32."""
    for run in two_ranks["pp_bf16_mixed"]:
        assert "traceback" not in run, run
        differences = [abs(a - b) for a, b in zip(run["losses"], expected["losses"][:4], strict=True)]
        assert 0 < max(differences) < 0.05, (run["losses"], expected["losses"][:4])
        assert {str(value.dtype) for value in run["state"].values()} == {"torch.float32"}
