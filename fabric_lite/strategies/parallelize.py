"""Ready-made ``parallelize_fn`` pieces for a standard transformer, plain functions over ``parallelize_module`` and
``fully_shard`` in the order torchtitan applies them::

    parallelize = partial(parallelize_transformer, plan=TransformerPlan(), loss_parallel=True)
    strategy = ModelParallelStrategy(parallelize, tensor_parallel_size=2)

:class:`TransformerPlan` defaults to torchtitan's Llama layout (``layers[i].attention.wq``, ...). Hugging Face's
Llama: ``blocks="model.layers"``, ``attention="self_attn"``, ``attention_in=("q_proj", "k_proj", "v_proj")``,
``attention_out="o_proj"``, ``mlp="mlp"``, ``mlp_in=("gate_proj", "up_proj")``, ``mlp_out="down_proj"``,
``norms=("input_layernorm", "post_attention_layernorm")``, ``embedding="model.embed_tokens"``,
``final_norm="model.norm"``, ``output="lm_head"``. For tensor parallelism attention must reshape with ``-1`` heads
(``view(batch, seq, -1, head_dim)``), and the heads and the MLP's hidden size must divide by its size.

:func:`split_transformer` cuts such a model into pipeline stages (``ModelParallelStrategy(...,
pipeline_parallel_size=2)``): each stage keeps its share of the blocks under their original names, the first the
embedding and the last the final norm and the output.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from torch.nn import Identity, Module, ModuleDict, ModuleList, Sequential

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import MixedPrecisionPolicy

__all__ = [
    "TransformerPlan",
    "apply_activation_checkpointing",
    "apply_fsdp",
    "apply_tensor_parallel",
    "blocks_of",
    "check_plan",
    "data_parallel_mesh",
    "parallelize_transformer",
    "split_transformer",
]


@dataclass(frozen=True)
class TransformerPlan:
    """Where a transformer's parts are: dotted module paths on the model (``blocks``, ``embedding``, ``final_norm``,
    ``output``; ``None`` leaves one out) and on each block (the rest).

    Args:
        blocks: the container of transformer blocks.
        attention: a block's attention; ``attention_inputs`` counts its forward's positional arguments (only the
            first is sequence-sharded).
        attention_in, attention_out: the q/k/v projections (column-wise) and the output projection (row-wise).
        mlp, mlp_in, mlp_out: a block's MLP, its input projections (column-wise) and output projection (row-wise).
        norms: the norms of a block (sequence-parallel with ``sequence_parallel=True``, otherwise replicated).
        embedding: the token embedding (row-wise); ``final_norm`` the last norm; ``output`` the head (column-wise).

    Raises:
        ValueError: an empty name, or ``attention_inputs`` below 1.
    """

    blocks: str = "layers"
    attention: str = "attention"
    attention_inputs: int = 2
    attention_in: tuple[str, ...] = ("wq", "wk", "wv")
    attention_out: str = "wo"
    mlp: str = "feed_forward"
    mlp_in: tuple[str, ...] = ("w1", "w3")
    mlp_out: str = "w2"
    norms: tuple[str, ...] = ("attention_norm", "ffn_norm")
    embedding: str | None = "tok_embeddings"
    final_norm: str | None = "norm"
    output: str | None = "output"

    def __post_init__(self) -> None:
        names = [self.blocks, self.attention, *self.attention_in, self.attention_out, self.mlp, *self.mlp_in]
        names += [self.mlp_out, *self.norms]
        if not all(isinstance(name, str) and name for name in names):
            raise ValueError(f"{self!r}: every module name must be a non-empty string.")
        if type(self.attention_inputs) is not int or self.attention_inputs < 1:
            raise ValueError(
                f"TransformerPlan(attention_inputs={self.attention_inputs!r}): the number of positional arguments"
                " of the attention's forward, at least 1 (x)."
            )


def blocks_of(model: Module, plan: TransformerPlan) -> list[Module]:
    """The transformer blocks of ``model`` (the children of ``plan.blocks``); ``AttributeError`` if none."""
    return list(_get(model, plan.blocks, "blocks").children())


def check_plan(model: Module, plan: TransformerPlan) -> None:
    """Check that ``model`` has every part ``plan`` names; ``AttributeError`` naming a missing one."""
    _check_top_parts(model, plan)
    for block in blocks_of(model, plan):
        for name in (*plan.norms, plan.attention, plan.mlp):
            _get(block, name, "block part")
        for name in (*plan.attention_in, plan.attention_out):
            _get(block, f"{plan.attention}.{name}", "attention projection")
        for name in (*plan.mlp_in, plan.mlp_out):
            _get(block, f"{plan.mlp}.{name}", "MLP projection")


def _check_top_parts(model: Module, plan: TransformerPlan) -> None:
    """``AttributeError`` naming the embedding, final norm or output that ``plan`` names and ``model`` lacks."""
    for path, role in ((plan.embedding, "embedding"), (plan.final_norm, "final_norm"), (plan.output, "output")):
        if path is not None:
            _get(model, path, role)


def data_parallel_mesh(device_mesh: DeviceMesh) -> DeviceMesh:
    """The mesh to give ``fully_shard``: ``("data_parallel_replicate", "data_parallel_shard")`` (HSDP) when the
    mesh has them, else ``"data_parallel"``."""
    if "data_parallel_replicate" in (device_mesh.mesh_dim_names or ()):
        return device_mesh["data_parallel_replicate", "data_parallel_shard"]
    return device_mesh["data_parallel"]


def apply_tensor_parallel(
    model: Module,
    tp_mesh: DeviceMesh,
    plan: TransformerPlan,
    *,
    sequence_parallel: bool = True,
    loss_parallel: bool = False,
) -> None:
    """Tensor-parallelise ``model`` in place over ``tp_mesh`` as ``plan`` says. ``sequence_parallel`` shards the
    activations between the parallel regions along the sequence (else they are replicated); with ``loss_parallel``
    the head's output stays sharded over the vocabulary, so compute the loss and backward under
    ``torch.distributed.tensor.parallel.loss_parallel()``."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )

    between = Shard(1) if sequence_parallel else Replicate()
    parts = [
        (plan.embedding, "embedding", RowwiseParallel(input_layouts=Replicate(), output_layouts=between)),
        (plan.final_norm, "final_norm", SequenceParallel() if sequence_parallel else None),
        (
            plan.output,
            "output",
            ColwiseParallel(
                input_layouts=between,
                output_layouts=Shard(-1) if loss_parallel else Replicate(),
                use_local_output=not loss_parallel,
            ),
        ),
    ]
    top: dict[str, Any] = {
        path: style
        for path, role, style in parts
        # a part that a pipeline stage leaves to another one is Dropped
        if path is not None and style is not None and not isinstance(_get(model, path, role), Dropped)
    }
    if top:
        parallelize_module(model, tp_mesh, top)
    for block in blocks_of(model, plan):
        layer: dict[str, Any] = {}
        for name in (*plan.norms, plan.attention, plan.mlp):
            _get(block, name, "block part")
        if sequence_parallel:
            layer.update({name: SequenceParallel() for name in plan.norms})
            extra = (None,) * (plan.attention_inputs - 1)
            layer[plan.attention] = PrepareModuleInput(
                input_layouts=(Shard(1), *extra), desired_input_layouts=(Replicate(), *extra)
            )
            layer[plan.mlp] = PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),))
        for name in plan.attention_in:
            layer[f"{plan.attention}.{name}"] = ColwiseParallel()
        layer[f"{plan.attention}.{plan.attention_out}"] = RowwiseParallel(output_layouts=between)
        for name in plan.mlp_in:
            layer[f"{plan.mlp}.{name}"] = ColwiseParallel()
        layer[f"{plan.mlp}.{plan.mlp_out}"] = RowwiseParallel(output_layouts=between)
        for path in layer:
            _get(block, path, "block part")
        parallelize_module(block, tp_mesh, layer)


def apply_activation_checkpointing(model: Module, plan: TransformerPlan) -> None:
    """Recompute each block's activations in backward; apply before :func:`apply_fsdp`."""
    from torch.distributed._composable.checkpoint_activation import checkpoint

    for block in blocks_of(model, plan):
        checkpoint(block)


def apply_fsdp(
    model: Module,
    dp_mesh: DeviceMesh,
    plan: TransformerPlan,
    *,
    mp_policy: MixedPrecisionPolicy | None = None,
    reshard_after_forward: bool = True,
) -> None:
    """Shard ``model`` over ``dp_mesh`` (2-D: HSDP) with ``fully_shard``: each block a unit, then the model. The
    last block stays gathered after forward, since backward needs it first."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    policy = mp_policy if mp_policy is not None else MixedPrecisionPolicy()
    blocks = blocks_of(model, plan)
    for index, block in enumerate(blocks):
        last = index == len(blocks) - 1
        fully_shard(block, mesh=dp_mesh, mp_policy=policy, reshard_after_forward=reshard_after_forward and not last)
    fully_shard(model, mesh=dp_mesh, mp_policy=policy, reshard_after_forward=reshard_after_forward)


def parallelize_transformer(
    model: Module,
    device_mesh: DeviceMesh,
    plan: TransformerPlan | None = None,
    *,
    sequence_parallel: bool = True,
    loss_parallel: bool = False,
    activation_checkpointing: bool = False,
    mp_policy: MixedPrecisionPolicy | None = None,
    reshard_after_forward: bool = True,
) -> Module:
    """A whole ``parallelize_fn`` for :class:`~fabric_lite.strategies.ModelParallelStrategy`: tensor parallelism,
    activation checkpointing, then FSDP2 (or HSDP), each over its mesh dimensions when they hold more than one rank.
    Returns ``model``.

    Raises:
        AttributeError: the model lacks a part that ``plan`` names; the message names it.
    """
    plan = plan if plan is not None else TransformerPlan()
    check_plan(model, plan)  # on every mesh, also where nothing is parallelised: a wrong name fails at once
    tp_mesh = device_mesh["tensor_parallel"]
    if tp_mesh.size() > 1:
        apply_tensor_parallel(model, tp_mesh, plan, sequence_parallel=sequence_parallel, loss_parallel=loss_parallel)
    if activation_checkpointing:
        apply_activation_checkpointing(model, plan)
    dp_mesh = data_parallel_mesh(device_mesh)
    if dp_mesh.size() > 1:
        apply_fsdp(model, dp_mesh, plan, mp_policy=mp_policy, reshard_after_forward=reshard_after_forward)
    return model


class StageBlocks(ModuleList):
    """A stage's share of a ``ModuleList`` of blocks under their names in the whole model (``"2"``, ``"3"``), so
    that its state dict has the whole model's keys; iterate over it (``for block in layers``), do not index it."""

    def __init__(self, blocks: list[tuple[str, Module]]) -> None:
        super().__init__()
        self._modules.update(blocks)


class Dropped(Identity):
    """What a pipeline stage has in place of a part that another stage runs: its input passes through."""


def split_transformer(
    model: Module, stages: list[int], num_stages: int, plan: TransformerPlan | None = None
) -> list[Module]:
    """A ``split_fn`` for ``ModelParallelStrategy(..., pipeline_parallel_size=...)``: one module per stage index in
    ``stages`` out of ``num_stages``, each a copy of ``model`` that shares its parts. Stage ``i`` keeps its share of the
    blocks (the earlier stages one more where they do not divide), stage 0 the embedding and the last stage the final
    norm and the output; the parts a stage does not run become :class:`Dropped` (an identity). The model's forward
    must be ``embedding -> blocks in order -> final norm -> output``, each taking the previous one's output.

    Raises:
        AttributeError: the model lacks a part that ``plan`` names.
        ValueError: fewer blocks than stages, or a stage index out of range.
        TypeError: the blocks are not in a ``ModuleList``, ``ModuleDict`` or ``Sequential``.
    """
    plan = plan if plan is not None else TransformerPlan()
    container = _get(model, plan.blocks, "blocks")
    names = list(container._modules)
    if len(names) < num_stages:
        raise ValueError(
            f"split_transformer: {type(model).__name__} has {len(names)} blocks in {plan.blocks!r}, too few for"
            f" {num_stages} pipeline stages (pipeline_parallel_size x stages per rank). Use at most {len(names)}"
            " stages, or a model with more blocks."
        )
    if any(type(stage) is not int or not 0 <= stage < num_stages for stage in stages):
        raise ValueError(f"split_transformer(stages={stages}): every stage index must be in 0..{num_stages - 1}.")
    if type(container) not in (ModuleList, ModuleDict, Sequential):
        raise TypeError(
            f"split_transformer: the blocks {plan.blocks!r} are a {type(container).__name__}; expected a ModuleList,"
            " ModuleDict or Sequential. Write a split_fn of your own for this model."
        )
    _check_top_parts(model, plan)
    share, extra = divmod(len(names), num_stages)
    parts = []
    for stage in stages:
        start = stage * share + min(stage, extra)
        kept = [(name, container.get_submodule(name)) for name in names[start : start + share + (stage < extra)]]
        blocks = StageBlocks(kept) if type(container) is ModuleList else type(container)(OrderedDict(kept))
        part = _shallow(model)
        _replace(part, plan.blocks, blocks)
        dropped = [plan.embedding] if stage > 0 else []
        dropped += [plan.final_norm, plan.output] if stage < num_stages - 1 else []
        for path in dropped:
            if path is not None:
                _replace(part, path, Dropped())
        parts.append(part)
    return parts


def _shallow(module: Module) -> Module:
    """A copy of ``module`` that shares its parameters, buffers and children but has dictionaries of its own, so a
    child can be replaced in the copy only."""
    copy = module.__class__.__new__(module.__class__)
    # every dictionary and set of its own (children, parameters, buffers, hooks): a hook that FSDP2 registers on one
    # stage must not run in another
    copy.__dict__.update({k: v.copy() if isinstance(v, (dict, set)) else v for k, v in module.__dict__.items()})
    return copy


def _replace(root: Module, path: str, new: Module) -> None:
    """Set the child at dotted ``path`` of ``root`` to ``new``, copying (:func:`_shallow`) the modules on the way so
    that the original model keeps its own."""
    *parents, leaf = path.split(".")
    module = root
    for name in parents:
        child = _shallow(module._modules[name])  # type: ignore[arg-type]
        module._modules[name] = child
        module = child
    module._modules[leaf] = new


def _get(root: Module, path: str, role: str) -> Module:
    module = root
    for part in path.split("."):
        child = getattr(module, part, None)
        if not isinstance(child, Module):
            children = ", ".join(name for name, _ in root.named_children())
            raise AttributeError(
                f"TransformerPlan: {type(root).__name__} has no {role} {path!r} (its children: {children}). Pass the"
                " module names of your model in TransformerPlan(...)."
            )
        module = child
    return module
