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
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from torch.nn import Module

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
    for path, role in ((plan.embedding, "embedding"), (plan.final_norm, "final_norm"), (plan.output, "output")):
        if path is not None:
            _get(model, path, role)
    for block in blocks_of(model, plan):
        for name in (*plan.norms, plan.attention, plan.mlp):
            _get(block, name, "block part")
        for name in (*plan.attention_in, plan.attention_out):
            _get(block, f"{plan.attention}.{name}", "attention projection")
        for name in (*plan.mlp_in, plan.mlp_out):
            _get(block, f"{plan.mlp}.{name}", "MLP projection")


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
    top: dict[str, Any] = {}
    if plan.embedding is not None:
        _get(model, plan.embedding, "embedding")
        top[plan.embedding] = RowwiseParallel(input_layouts=Replicate(), output_layouts=between)
    if plan.final_norm is not None and sequence_parallel:
        _get(model, plan.final_norm, "final_norm")
        top[plan.final_norm] = SequenceParallel()
    if plan.output is not None:
        _get(model, plan.output, "output")
        top[plan.output] = ColwiseParallel(
            input_layouts=between,
            output_layouts=Shard(-1) if loss_parallel else Replicate(),
            use_local_output=not loss_parallel,
        )
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
