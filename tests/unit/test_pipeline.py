"""Pipeline parallelism without processes: ModelParallelStrategy's pipeline arguments and mesh arithmetic, the
transformer splitter, a rank's stages as one module, the schedules by name, and ``fabric.pipeline_step`` where the
strategy does not pipeline. The pipelines themselves train on gloo ranks in tests/distributed/test_model_parallel.py."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from fabric_lite import Fabric
from fabric_lite.strategies import ModelParallelStrategy
from fabric_lite.strategies._model_parallel_ops import MeshSizeError, mesh_shape
from fabric_lite.strategies._pipeline import RankStages, merge_stages, schedule_class, stage_indices, stages_per_rank
from fabric_lite.strategies.parallelize import Dropped, TransformerPlan, split_transformer
from tests.helpers.jobs.model_parallel_jobs import Llama, Tokens, loss_of


def _identity(module: nn.Module, mesh: Any) -> nn.Module:
    return module


# ---------------------------------------------------------------------------------------------- arguments
@pytest.mark.parametrize(
    ("kwargs", "error", "fragment"),
    [
        ({"pipeline_parallel_size": 0}, ValueError, r"pipeline_parallel_size=0\): expected a positive int"),
        ({"pipeline_parallel_size": "2"}, ValueError, r"pipeline_parallel_size='2'"),
        ({"pipeline_schedule": "Zigzag"}, ValueError, r"pipeline_schedule='Zigzag'.*GPipe, 1F1B, Interleaved1F1B"),
        ({"pipeline_microbatches": 0}, ValueError, r"pipeline_microbatches=0"),
        ({"pipeline_schedule": "1F1B", "pipeline_stages_per_rank": 2}, ValueError, r"pass 1 \(or leave it None\)"),
        ({"pipeline_schedule": "ZBVZeroBubble", "pipeline_stages_per_rank": 3}, ValueError, r"pass 2"),
        ({"pipeline_schedule": "Interleaved1F1B", "pipeline_stages_per_rank": 0}, ValueError, "a positive int"),
        ({"split_fn": "layers"}, TypeError, r"split_fn='layers'.*fn\(model, stage_indices, num_stages\)"),
        (
            {"pipeline_parallel_size": 2, "save_distributed_checkpoint": False},
            ValueError,
            r"save_distributed_checkpoint=False\).*fabric-lite consolidate",
        ),
    ],
)
def test_bad_pipeline_arguments_raise_naming_the_value(kwargs: dict[str, Any], error: type, fragment: str) -> None:
    with pytest.raises(error, match=fragment):
        ModelParallelStrategy(_identity, **kwargs)


def test_schedules_by_name_and_their_stages() -> None:
    from torch.distributed.pipelining import Schedule1F1B, ScheduleInterleaved1F1B

    assert schedule_class("1f1b") is Schedule1F1B and schedule_class("interleaved1F1B") is ScheduleInterleaved1F1B
    assert [stages_per_rank(name, None) for name in ("GPipe", "1F1B", "Interleaved1F1B", "ZBVZeroBubble")] == [
        1,
        1,
        2,
        2,
    ]
    assert stages_per_rank("LoopedBFS", 3) == 3
    assert [stage_indices("Interleaved1F1B", rank, 2, 2) for rank in (0, 1)] == [[0, 2], [1, 3]]  # a loop
    assert [stage_indices("ZBVZeroBubble", rank, 2, 2) for rank in (0, 1)] == [[0, 3], [1, 2]]  # a V
    assert stage_indices("1F1B", 1, 4, 1) == [1]


def test_mesh_shape_with_a_pipeline_and_hsdp() -> None:
    assert mesh_shape(4, 1, 2, 8, 1, 2) == (2, 2, 2, 1)  # pipeline, replicate, shard, tensor parallel


@pytest.mark.parametrize(
    ("dp", "tp", "world", "nodes", "pipeline", "shape"),
    [
        ("auto", "auto", 4, 1, 2, (2, 1, 2)),  # the stage's ranks within the node: tensor parallel
        (2, "auto", 8, 1, 2, (2, 2, 2)),
        ("auto", 1, 4, 1, 2, (2, 2, 1)),
        ("auto", "auto", 8, 4, 2, (2, 2, 2)),  # 2 nodes per stage: data parallel across them
        ("auto", "auto", 4, 1, 4, (4, 1, 1)),
    ],
)
def test_mesh_shapes_with_a_pipeline(
    dp: Any, tp: Any, world: int, nodes: int, pipeline: int, shape: tuple[int, ...]
) -> None:
    assert mesh_shape(dp, tp, 1, world, nodes, pipeline) == shape


def test_mesh_sizes_with_a_pipeline_that_do_not_fit_show_the_arithmetic() -> None:
    with pytest.raises(MeshSizeError, match=r"pipeline_parallel_size \(4\) must divide the world size \(6 = 1 node"):
        mesh_shape("auto", "auto", 1, 6, 1, 4)
    with pytest.raises(MeshSizeError, match=r"equal the ranks of one pipeline stage \(2 = world size 4 / pipeline 2\)"):
        mesh_shape(2, 2, 1, 4, 1, 2)
    with pytest.raises(ValueError, match=r"pipeline_parallel_size \(2\) must divide the world size \(3"):
        Fabric(accelerator="cpu", devices=3, strategy=ModelParallelStrategy(_identity, pipeline_parallel_size=2))


def test_repr_names_the_pipeline() -> None:
    strategy = ModelParallelStrategy(_identity, pipeline_parallel_size=2, pipeline_schedule="GPipe")
    assert "pipeline_parallel_size=2, pipeline_schedule='GPipe'" in repr(strategy)
    assert "pipeline" not in repr(ModelParallelStrategy(_identity))


# ---------------------------------------------------------------------------------------------- the splitter
def _parameter_ids(module: nn.Module) -> dict[str, int]:
    return {name: id(p) for name, p in module.named_parameters()}


def test_split_transformer_keeps_names_shares_parameters_and_chains_to_the_model() -> None:
    """Five blocks in two stages: 3 + 2 (the earlier stage takes the extra one), the first with the embedding and the
    last with the norm and head; the names are the model's, the parameters the model's own, the original model is
    untouched, and running the stages one after the other is the model's forward."""
    torch.manual_seed(0)
    model = Llama(depth=5)
    ids = _parameter_ids(model)
    first, last = split_transformer(model, [0, 1], 2)
    assert [name for name, _ in first.layers.named_children()] == ["0", "1", "2"]
    assert [name for name, _ in last.layers.named_children()] == ["3", "4"]
    assert isinstance(first.norm, Dropped) and isinstance(first.output, Dropped)
    assert isinstance(last.tok_embeddings, Dropped)
    for part in (first, last):
        assert {name: id(p) for name, p in part.named_parameters()}.items() <= ids.items()
    assert set(_parameter_ids(first)) | set(_parameter_ids(last)) == set(ids)
    assert len(model.layers) == 5 and isinstance(model.norm, nn.RMSNorm)  # the original keeps its parts
    tokens = Tokens().data[:4, :-1]
    torch.testing.assert_close(last(first(tokens)), model(tokens), atol=0, rtol=0)


def test_split_transformer_follows_a_nested_plan_and_refuses_what_does_not_split() -> None:
    class Wrapper(nn.Module):  # Hugging Face's layout: the blocks one level down
        def __init__(self) -> None:
            super().__init__()
            self.model = Llama(depth=2)

    wrapper = Wrapper()
    plan = TransformerPlan(blocks="model.layers", embedding="model.tok_embeddings", final_norm="model.norm",
                           output="model.output")  # fmt: skip
    first, second = split_transformer(wrapper, [0, 1], 2, plan)
    assert next(n for n, _ in first.named_parameters()) == "model.tok_embeddings.weight"
    assert "model.layers.1.attention.wq.weight" in dict(second.named_parameters())
    assert len(wrapper.model.layers) == 2 and not isinstance(wrapper.model.output, Dropped)
    with pytest.raises(ValueError, match=r"has 2 blocks in 'layers', too few for 3 pipeline stages"):
        split_transformer(Llama(depth=2), [0], 3)
    with pytest.raises(ValueError, match=r"stages=\[2\]\): every stage index must be in 0..1"):
        split_transformer(Llama(depth=2), [2], 2)
    with pytest.raises(AttributeError, match="has no blocks 'blocks'"):
        split_transformer(Llama(depth=2), [0], 2, TransformerPlan(blocks="blocks"))

    class Blocks(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = nn.Linear(2, 2), nn.Linear(2, 2)

    odd = Llama(depth=2)
    odd.layers = Blocks()  # type: ignore[assignment]
    with pytest.raises(TypeError, match=r"the blocks 'layers' are a Blocks; expected a ModuleList"):
        split_transformer(odd, [0], 2)


def test_a_rank_with_two_stages_is_one_module_with_the_model_names() -> None:
    """Stages 0 and 2 of 4 (Interleaved1F1B's rank 0): one module holding the embedding and blocks 0 and 2, whose
    parameters are the stages' own; calling it is refused, and two different modules under one name are named."""
    model = Llama(depth=4)
    parts = split_transformer(model, [0, 2], 4)
    union = merge_stages(parts)
    assert isinstance(union, RankStages)
    names = [name for name, _ in union.named_parameters()]
    assert names[0] == "tok_embeddings.weight" and {n.split(".")[1] for n in names if n.startswith("layers")} == {
        "0",
        "2",
    }
    assert not any(n.startswith(("norm", "output")) for n in names)
    assert set(_parameter_ids(union).items()) == set(_parameter_ids(parts[0]).items()) | set(
        _parameter_ids(parts[1]).items()
    )
    with pytest.raises(RuntimeError, match=r"fabric.pipeline_step\(model, inputs"):
        union(torch.zeros(1, 2, dtype=torch.long))
    assert merge_stages([parts[0]]) is parts[0]
    other = split_transformer(Llama(depth=4), [2], 4)[0]  # another model's stage: different parameters
    with pytest.raises(ValueError, match=r"different parameters layers\.2\.attention_norm\.weight"):
        merge_stages([parts[0], parts[1], other])


# ---------------------------------------------------------------------------------------------- pipeline_step
def test_pipeline_step_without_a_pipeline_is_forward_loss_and_backward() -> None:
    """On a strategy that does not pipeline, the step is ``loss_fn(model(x), target)`` and ``fabric.backward``, so one
    loop runs with and without a pipeline; under ``torch.no_grad()`` the forward only."""
    fabric = Fabric(accelerator="cpu", devices=1)
    torch.manual_seed(0)
    model = Llama()
    twin = Llama()
    twin.load_state_dict(model.state_dict())
    wrapped = fabric.setup_module(model)
    batch = Tokens().data[:4]
    loss = fabric.pipeline_step(wrapped, batch[:, :-1], target=batch, loss_fn=loss_of)
    expected = loss_of(twin(batch[:, :-1]), batch)
    expected.backward()
    assert not loss.requires_grad and torch.equal(loss, expected.detach())
    for (name, p), q in zip(model.named_parameters(), twin.parameters(), strict=True):
        assert torch.equal(p.grad, q.grad), name
    model.zero_grad(set_to_none=True)
    with torch.no_grad():
        again = fabric.pipeline_step(wrapped, batch[:, :-1], target=batch, loss_fn=loss_of)
    assert torch.equal(again, loss) and all(p.grad is None for p in model.parameters())
    with pytest.raises(TypeError, match=r"takes the model that fabric.setup returned.*Got Llama"):
        fabric.pipeline_step(twin, batch[:, :-1], target=batch, loss_fn=loss_of)


# ---------------------------------------------------------------------------------------------- one rank
@pytest.fixture
def one_rank_world() -> Any:
    """A 1-rank gloo world in this process (a hash store, no port); destroyed afterwards."""
    import torch.distributed as dist

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield dist.group.WORLD
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("schedule", ["Interleaved1F1B", "ZBVZeroBubble"])
def test_two_stages_on_one_rank_give_the_whole_batch_gradients(one_rank_world: Any, schedule: str) -> None:
    """A rank running two stages under a multi-stage schedule, with no peer: the step's loss and gradients are the
    unsplit model's over the whole batch; ``torch.no_grad()`` is refused (torch's multi-stage schedules run their
    backward actions in ``eval()`` too, and fail), and the stages still train after; the batch must divide."""
    from fabric_lite.strategies._pipeline import Pipeline

    torch.manual_seed(0)
    model, twin = Llama(depth=4), Llama(depth=4)
    twin.load_state_dict(model.state_dict())
    stages = stage_indices(schedule, 0, 1, 2)
    pipeline = Pipeline(
        split_transformer(model, stages, 2), stages, 2, one_rank_world, torch.device("cpu"), schedule, 4
    )
    batch = Tokens().data[:8]
    loss = pipeline.step((batch[:, :-1],), {}, batch, loss_of)
    expected = loss_of(twin(batch[:, :-1]), batch)
    expected.backward()
    assert loss.item() == pytest.approx(expected.item(), abs=1e-6) and pipeline.last_loss is loss
    grads = dict(pipeline.module.named_parameters())
    for name, param in twin.named_parameters():
        torch.testing.assert_close(grads[name].grad, param.grad, atol=1e-6, rtol=0, msg=name)
    with torch.no_grad(), pytest.raises(RuntimeError, match=r"cannot run the forward alone.*'GPipe' or '1F1B'"):
        pipeline.step((batch[:, :-1],), {}, batch, loss_of)
    pipeline.module.zero_grad(set_to_none=True)
    again = pipeline.step((batch[:, :-1],), {}, batch, loss_of)
    assert again.item() == pytest.approx(expected.item(), abs=1e-6)
    for name, param in twin.named_parameters():
        torch.testing.assert_close(grads[name].grad, param.grad, atol=1e-6, rtol=0, msg=name)
    with pytest.raises(ValueError, match=r"target has 6 samples, which pipeline_microbatches=4 does not divide"):
        pipeline.step((batch[:8, :-1],), {}, batch[:6], loss_of)
    with pytest.raises(ValueError, match="no inputs"):
        pipeline.step((), {}, batch, loss_of)
