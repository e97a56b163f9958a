"""N-D parallelism on a ``DeviceMesh``: tensor (and sequence) parallelism within a node, sharded data parallelism
(FSDP2) across nodes, optionally HSDP, as the user's ``parallelize_fn(module, device_mesh)`` applies them, and pipeline
parallelism over ``torch.distributed.pipelining``."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import torch
import torch.distributed as dist
from torch import Tensor
from torch.nn import Module
from torch.optim import Optimizer
from typing_extensions import override

from fabric_lite.accelerators import Accelerator
from fabric_lite.plugins.environments import ClusterEnvironment
from fabric_lite.plugins.precision import Precision
from fabric_lite.plugins.precision.fsdp import mixed_precision_policy
from fabric_lite.runtime import collectives
from fabric_lite.runtime.checkpoint import sharded
from fabric_lite.strategies import _fsdp_setup, _model_parallel_ops, _pipeline, parallelize
from fabric_lite.strategies._backward_sync import _NestedSyncSwitch
from fabric_lite.strategies.parallel import ParallelStrategy, default_pg_timeout
from fabric_lite.strategies.strategy import _set_gradient_sync, _Sharded
from fabric_lite.utilities.types import TBroadcast

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import MixedPrecisionPolicy

TModel = TypeVar("TModel", bound=Module)

#: the precisions the strategy runs in, as in Lightning Fabric
_PRECISIONS = ("32-true", "bf16-mixed", "bf16-true", "16-true")
#: mesh dimension names: Lightning's two, and the two that the data-parallel one is made of with HSDP
DATA_PARALLEL, TENSOR_PARALLEL = "data_parallel", "tensor_parallel"
REPLICATE, SHARD = "data_parallel_replicate", "data_parallel_shard"
PIPELINE_PARALLEL = "pipeline_parallel"
_ALL = "data_parallel_tensor_parallel"
#: ``split_fn(model, stage_indices, num_stages) -> one module per stage index``
SplitFn = Callable[[Module, list[int], int], list[Module]]


class ModelParallelStrategy(_Sharded, ParallelStrategy):
    """Tensor, sequence and sharded data parallelism together on a ``DeviceMesh``, as Lightning's, plus HSDP and
    pipeline parallelism.

    ``fabric.launch()`` builds a ``("data_parallel", "tensor_parallel")`` mesh (tensor-parallel groups are
    consecutive ranks, so they share a node); ``fabric.setup_module(model)`` returns
    ``parallelize_fn(model, mesh)`` (:mod:`fabric_lite.strategies.parallelize` writes one for a transformer). The
    ranks of a tensor-parallel group get the same batches; a meta-device model is initialised as under
    :class:`FSDPStrategy`, so its values do not depend on the mesh. Collectives take ``group=`` a sub-mesh's group.
    With ``pipeline_parallel_size > 1`` the model is split into stages before ``parallelize_fn`` runs on each, and a
    training step is ``fabric.pipeline_step`` (the schedule interleaves the micro-batches' forwards and backwards).

    Args:
        parallelize_fn: ``fn(module, device_mesh) -> module`` applying the parallelisms.
        data_parallel_size: ranks in a data-parallel group; ``"auto"``: the number of nodes, or what
            ``tensor_parallel_size`` leaves.
        tensor_parallel_size: ranks in a tensor-parallel group; ``"auto"``: the devices of one node, or what
            ``data_parallel_size`` leaves.
        save_distributed_checkpoint: ``True``: ``fabric.save`` writes a folder of shards; ``False``: one full file.
        process_group_backend, timeout: as for :class:`ParallelStrategy`.
        data_parallel_replicate_size: HSDP: split the data-parallel ranks into this many replicated groups of
            shards; the mesh becomes ``("data_parallel_replicate", "data_parallel_shard", "tensor_parallel")``.
        pipeline_parallel_size: pipeline stages over this many ranks (a ``"pipeline_parallel"`` mesh dimension,
            outermost); ``split_fn`` cuts the model into stages before ``parallelize_fn`` runs on each, and a step is
            ``fabric.pipeline_step(model, inputs, target=..., loss_fn=...)``.
        pipeline_schedule: a schedule of ``torch.distributed.pipelining`` by name (``"GPipe"``, ``"1F1B"``,
            ``"Interleaved1F1B"``, ``"LoopedBFS"``, ``"InterleavedZeroBubble"``, ``"ZBVZeroBubble"``, ``"DualPipeV"``).
        pipeline_microbatches: micro-batches per batch; default: the number of stages.
        pipeline_stages_per_rank: stages each rank runs under a multi-stage schedule (default 2).
        split_fn: ``fn(model, stage_indices, num_stages) -> [module per stage]``; default
            :func:`~fabric_lite.strategies.parallelize.split_transformer` (the blocks of a ``TransformerPlan()``).
        start_method: ``"popen"`` re-runs the script; ``"spawn"``/``"fork"`` run ``launch(fn)`` in new processes.

    Raises:
        TypeError, ValueError: an argument that is not accepted, or sizes that do not multiply to the world size.

    Example::

        fabric = Fabric(devices=4, strategy=ModelParallelStrategy(parallelize, tensor_parallel_size=2))
    """

    def __init__(
        self,
        parallelize_fn: Callable[[TModel, DeviceMesh], TModel],
        data_parallel_size: Literal["auto"] | int = "auto",
        tensor_parallel_size: Literal["auto"] | int = "auto",
        save_distributed_checkpoint: bool = True,
        process_group_backend: str | None = None,
        timeout: timedelta | None = default_pg_timeout,
        *,
        data_parallel_replicate_size: int = 1,
        pipeline_parallel_size: int = 1,
        pipeline_schedule: str = "1F1B",
        pipeline_microbatches: int | None = None,
        pipeline_stages_per_rank: int | None = None,
        split_fn: SplitFn | None = None,
        start_method: Literal["popen", "spawn", "fork"] = "popen",
        accelerator: Accelerator | None = None,
        parallel_devices: list[torch.device] | None = None,
        cluster_environment: ClusterEnvironment | None = None,
        precision: Precision | None = None,
    ) -> None:
        super().__init__(
            accelerator=accelerator,
            parallel_devices=parallel_devices,
            cluster_environment=cluster_environment,
            precision=precision,
            process_group_backend=process_group_backend,
            timeout=timeout,
        )
        try:
            from torch.distributed.fsdp import fully_shard  # noqa: F401
            from torch.distributed.tensor.parallel import parallelize_module  # noqa: F401
        except ImportError as err:
            raise ImportError(
                f"ModelParallelStrategy needs torch.distributed.fsdp.fully_shard and torch.distributed.tensor"
                f" (torch >= 2.6); this is torch {torch.__version__}. Upgrade torch, or use strategy='fsdp'."
            ) from err
        if not callable(parallelize_fn):
            raise TypeError(
                f"ModelParallelStrategy(parallelize_fn={parallelize_fn!r}): expected a function"
                " fn(module, device_mesh) that parallelises the module and returns it."
            )
        for name, value in (("data_parallel_size", data_parallel_size), ("tensor_parallel_size", tensor_parallel_size)):
            if value != "auto" and (type(value) is not int or value < 1):
                raise ValueError(f"ModelParallelStrategy({name}={value!r}): expected 'auto' or a positive int.")
        if type(data_parallel_replicate_size) is not int or data_parallel_replicate_size < 1:
            raise ValueError(
                f"ModelParallelStrategy(data_parallel_replicate_size={data_parallel_replicate_size!r}): expected a"
                " positive int (1: no replication, plain FSDP over the data-parallel ranks)."
            )
        if type(data_parallel_size) is int and data_parallel_size % data_parallel_replicate_size:
            raise ValueError(
                f"ModelParallelStrategy(data_parallel_size={data_parallel_size},"
                f" data_parallel_replicate_size={data_parallel_replicate_size}): the data-parallel ranks must split"
                f" into {data_parallel_replicate_size} equal groups of shards; choose a replicate size that divides"
                f" {data_parallel_size}."
            )
        if not isinstance(save_distributed_checkpoint, bool):
            raise TypeError(
                f"ModelParallelStrategy(save_distributed_checkpoint={save_distributed_checkpoint!r}): expected True"
                " (a folder of shards) or False (one full file)."
            )
        _check_pipeline(pipeline_parallel_size, pipeline_microbatches, split_fn, save_distributed_checkpoint)
        self._pipeline_size = pipeline_parallel_size
        self._schedule = _pipeline.schedule_name(pipeline_schedule)
        self._stages_per_rank = _pipeline.stages_per_rank(pipeline_schedule, pipeline_stages_per_rank)
        self._microbatches = pipeline_microbatches
        self._split_fn = split_fn
        self._pipelines: dict[int, _pipeline.Pipeline] = {}  # by id of the module that setup_module returned
        self._set_start_method(start_method)
        self._parallelize_fn: Callable[[Module, DeviceMesh], Module] = parallelize_fn  # type: ignore[assignment]
        self._data_parallel_size = data_parallel_size
        self._tensor_parallel_size = tensor_parallel_size
        self._replicate_size = data_parallel_replicate_size
        self._save_distributed_checkpoint = save_distributed_checkpoint
        self._backward_sync_control = _ParallelBackwardSyncControl(self._sync_target, _set_gradient_sync)

    # ------------------------------------------------------------------ configuration
    @classmethod
    @override
    def _check_choices(cls, *, label: str, accelerator: str, precision: str) -> None:
        """Refuse a precision the strategy does not run (one of ``_PRECISIONS``)."""
        _check_precision(precision)

    @property
    @override
    def precision(self) -> Precision:
        return super().precision

    @precision.setter
    def precision(self, precision: Precision | None) -> None:
        _check_precision(getattr(precision, "precision", "32-true"))  # None: the default, "32-true"
        self._precision = precision

    @property
    @override
    def state_dict_type(self) -> str:
        """What ``fabric.save`` writes: ``"sharded"`` (``save_distributed_checkpoint=True``) or ``"full"``."""
        return "sharded" if self._save_distributed_checkpoint else "full"

    @property
    def mesh_shape(self) -> tuple[int, ...]:
        """``(data_parallel, tensor_parallel)``, or ``(replicate, shard, tensor_parallel)`` with HSDP, for the
        strategy's world size; with a pipeline, its size first.

        Raises:
            MeshSizeError: the sizes do not multiply to the world size (a ``ValueError`` and ``RuntimeError``).
        """
        return _model_parallel_ops.mesh_shape(
            self._data_parallel_size,
            self._tensor_parallel_size,
            self._replicate_size,
            self.num_nodes * self.num_processes,
            self.num_nodes,
            self._pipeline_size,
        )

    @property
    def device_mesh(self) -> DeviceMesh:
        """The mesh ``parallelize_fn`` gets (:func:`_setup_device_mesh`); ``RuntimeError`` before ``fabric.launch``."""
        if self._device_mesh is None:
            raise RuntimeError(
                "Accessing the device mesh before the processes have initialized is not allowed: the mesh of"
                " ModelParallelStrategy.device_mesh is built when they start. Call fabric.launch() first."
            )
        return self._device_mesh

    @property
    def mixed_precision_policy(self) -> MixedPrecisionPolicy:
        """The FSDP2 ``MixedPrecisionPolicy`` that matches the precision, for ``fully_shard`` in ``parallelize_fn``."""
        return mixed_precision_policy(self.precision.precision)

    @property
    @override
    def distributed_sampler_kwargs(self) -> dict[str, Any]:
        """The data-parallel dimension's size and this rank's place in it (a tensor-parallel group shares batches)."""
        data_parallel = self.device_mesh[DATA_PARALLEL]
        return {"num_replicas": data_parallel.size(), "rank": data_parallel.get_local_rank()}

    @override
    def _set_world_ranks(self) -> None:
        super()._set_world_ranks()
        if self.num_processes:  # Fabric has filled in the devices: the sizes can be checked before any process starts
            _ = self.mesh_shape

    @override
    def _build_mesh(self) -> DeviceMesh:
        if self._pipeline_size > 1:
            return _setup_device_mesh(self.mesh_shape, self.root_device.type, pipeline=True)
        return _setup_device_mesh(self.mesh_shape, self.root_device.type)

    # ------------------------------------------------------------------ modules and optimizers
    @override
    def setup_module(self, module: Module) -> Module:
        """``parallelize_fn(module, device_mesh)``, then the meta-device parameters materialised shard by shard.

        Raises:
            TypeError: the module holds FSDP1 modules, or ``parallelize_fn`` did not return a module.
            RuntimeError: the module holds meta-device and real tensors at once.
        """
        from torch.distributed.fsdp import FullyShardedDataParallel

        if any(isinstance(m, FullyShardedDataParallel) for m in module.modules()):
            raise TypeError(
                "The module holds torch.distributed.fsdp.FullyShardedDataParallel (FSDP1) modules, which"
                " ModelParallelStrategy cannot combine with tensor parallelism: it only supports the new FSDP2 APIs"
                " in PyTorch >= 2.4. Pass the plain module and shard it in parallelize_fn with"
                " torch.distributed.fsdp.fully_shard (FSDP2)."
            )
        owners = _fsdp_setup.meta_owners(module)  # of the whole model, also when it is split into stages
        if owners:
            _fsdp_setup.check_initialisable(module, owners, None)
        if self._pipeline_size > 1:
            return self._setup_pipeline(module, owners)
        parallel = self._parallelize(module)
        self._materialize(parallel, owners)
        self._modules.add(parallel)
        return parallel

    def _parallelize(self, module: Module) -> Module:
        parallel = self._parallelize_fn(module, self.device_mesh)
        if not isinstance(parallel, Module):
            raise TypeError(
                f"The `parallelize_fn` must return a `nn.Module` instance, but got: {type(parallel).__name__}."
                f" {getattr(self._parallelize_fn, '__name__', self._parallelize_fn)!r} must return the parallelised"
                " module: end it with `return module`."
            )
        return parallel

    def _materialize(self, module: Module, owners: list[_fsdp_setup.MetaOwner]) -> None:
        """Initialise the meta-device tensors of ``owners`` (the whole model's, in construction order, so that the
        values do not depend on the mesh) into ``module``'s shards, and move what ``parallelize_fn`` left behind."""
        if owners:
            _fsdp_setup.materialize(module, owners, self.root_device, None)
        _model_parallel_ops.move_leftovers(module, self.root_device)

    def _setup_pipeline(self, module: Module, owners: list[_fsdp_setup.MetaOwner]) -> Module:
        """Split ``module`` into this rank's stages (``split_fn``), parallelise each, and build their schedule; the
        whole model's meta-device ``owners`` are initialised in the same order on every rank. Returns the stage, or
        with several stages per rank their union (:class:`~._pipeline.RankStages`)."""
        mesh = self.device_mesh[PIPELINE_PARALLEL]
        size, per_rank = mesh.size(), self._stages_per_rank
        num_stages = size * per_rank
        stages = _pipeline.stage_indices(self._schedule, mesh.get_local_rank(), size, per_rank)
        split = self._split_fn or parallelize.split_transformer
        with torch.random.fork_rng(devices=[]):  # a module split_fn creates must not move the values initialised below
            parts = split(module, stages, num_stages)
        if (
            not isinstance(parts, (list, tuple))
            or len(parts) != len(stages)
            or not all(isinstance(p, Module) for p in parts)
        ):
            raise TypeError(
                f"split_fn {getattr(split, '__name__', split)!r} returned {type(parts).__name__}"
                f"{f' of {len(parts)}' if isinstance(parts, (list, tuple)) else ''}; expected a list of"
                f" {len(stages)} module(s), one for each stage index in {stages} (of {num_stages})."
            )
        parts = [self._parallelize(part) for part in parts]
        microbatches = self._microbatches or num_stages
        pipeline = _pipeline.Pipeline(
            parts, stages, num_stages, mesh.get_group(), self.root_device, self._schedule, microbatches
        )
        self._materialize(pipeline.module, owners)
        self._pipelines[id(pipeline.module)] = pipeline
        self._modules.add(pipeline.module)
        return pipeline.module

    @override
    def compile_module(self, module: Module, compiler: Any) -> Module:
        if self._pipeline_size > 1:
            raise TypeError(
                "fabric.setup(torch.compile(model)) with ModelParallelStrategy(pipeline_parallel_size="
                f"{self._pipeline_size}): the stages are run by the pipeline schedule, not by the model's forward."
                " Pass the plain model and compile the blocks in parallelize_fn (torch.compile(block) for each)."
            )
        return super().compile_module(module, compiler)

    @override
    def pipeline(self, module: Module) -> _pipeline.Pipeline | None:
        """The pipeline that runs ``module`` (what ``setup_module`` returned), or ``None`` where it is not pipelined."""
        return self._pipelines.get(id(module))

    @override
    def _foreign_keys(self, module: Module) -> set[str]:
        pipeline = self.pipeline(module)
        return set() if pipeline is None else pipeline.foreign_keys()

    @override
    def _complete_groups(self, module: Module, optimizer_state: dict[str, Any]) -> dict[str, Any]:
        pipeline = self.pipeline(module)
        return optimizer_state if pipeline is None else pipeline.complete_groups(optimizer_state)

    @override
    def no_backward_sync(self, module: Module, enabled: bool = True) -> AbstractContextManager[Any]:
        """FSDP2's gradient reduction off while the block is open; refused for a pipelined module, whose schedule
        decides at its last micro-batch."""
        if enabled and self.pipeline(module) is not None:
            raise RuntimeError(
                "fabric.no_backward_sync(model) on a pipelined model: the pipeline schedule accumulates the gradients"
                " of its micro-batches and reduces them once, at the last one. Instead of accumulating over several"
                " fabric.pipeline_step calls, raise ModelParallelStrategy(pipeline_microbatches=...) and the batch"
                " size."
            )
        return super().no_backward_sync(module, enabled)

    @override
    def backward(self, tensor: Tensor, module: Module | None, *args: Any, **kwargs: Any) -> None:
        if any(tensor is pipeline.last_loss for pipeline in self._pipelines.values()):
            raise RuntimeError(
                "fabric.backward(loss) with the loss of fabric.pipeline_step: the pipeline schedule already ran"
                " backward over every micro-batch (it interleaves them with the forwards). Call optimizer.step()"
                " next, without fabric.backward."
            )
        super().backward(tensor, module, *args, **kwargs)

    @override
    def _prepare_optimizer(self, optimizer: Optimizer) -> None:
        """Turn ``foreach=None`` into ``False`` in parameter groups that mix DTensors and plain tensors; ``ValueError``
        where such a group asks for ``foreach=True`` or ``fused=True``."""
        names = {id(p): name for module in self._modules for name, p in module.named_parameters()}
        _model_parallel_ops.settle_foreach(optimizer, names)

    # ------------------------------------------------------------------ training
    @override
    def clip_gradients_norm(
        self,
        module: Module,
        optimizer: Optimizer,
        max_norm: float,
        norm_type: float = 2.0,
        error_if_nonfinite: bool = True,
    ) -> Tensor:
        """Clip by the total norm over every gradient (the same on every rank); return it before clipping. The norm
        is combined from groups of like gradients, as ``clip_grad_norm_`` cannot mix DTensor meshes."""
        precision = self.precision
        precision.unscale_gradients(optimizer)
        groups = _model_parallel_ops.like_groups([p for p in precision.main_params(optimizer) if p.grad is not None])
        total = _model_parallel_ops.total_norm(groups, float(norm_type))
        if self._pipeline_size > 1:  # each pipeline rank holds other layers: combine their norms
            total = _model_parallel_ops.combine_norms(total, float(norm_type), self.device_mesh[PIPELINE_PARALLEL])
        if error_if_nonfinite and not precision.skips_nonfinite_steps() and not torch.isfinite(total):
            raise RuntimeError(
                f"The total norm of order {norm_type} of the gradients is non-finite ({total.item()}), so they cannot"
                " be clipped. Pass error_if_nonfinite=False to fabric.clip_gradients to clip anyway."
            )
        for group in groups:  # one foreach multiplication per kind: they cannot mix meshes
            torch.nn.utils.clip_grads_with_norm_(group, max_norm, total)
        return total

    # ------------------------------------------------------------------ collectives
    @override
    def broadcast(self, obj: TBroadcast, src: int = 0, group: Any | None = None) -> TBroadcast:
        """Send ``obj`` from global rank ``src`` to every process (of ``group``, a sub-mesh's group, when given) and
        return it there. Every process of the group must call it."""
        if group is None:
            return super().broadcast(obj, src)
        if type(src) is not int or not 0 <= src < max(self.world_size, 1):
            raise ValueError(f"broadcast(src={src!r}) is not a rank: choose one of 0..{self.world_size - 1}.")
        if src not in dist.get_process_group_ranks(group):
            raise ValueError(
                f"broadcast(src={src}, group=...): rank {src} is not in the group (its global ranks are"
                f" {dist.get_process_group_ranks(group)}). src is a global rank of the group."
            )
        try:
            return collectives.broadcast(obj, src, self._checked(group), self._comm_device())  # type: ignore[no-any-return]
        except RuntimeError as err:
            self._raise_if_timed_out(f"broadcast(src={src})", err)
            raise

    @override
    def barrier(self, name: str | None = None, group: Any | None = None) -> None:
        """Wait until every process (of ``group``, when given) has entered the barrier."""
        if group is None or not dist.is_initialized():
            super().barrier(name)
            return
        try:
            dist.barrier(group=group)
        except RuntimeError as err:
            self._raise_if_timed_out(f"barrier({name!r})" if name else "barrier", err)
            raise

    @override
    def teardown(self) -> None:
        self._pipelines = {}
        super().teardown()

    def __repr__(self) -> str:
        pipeline = (
            f" pipeline_parallel_size={self._pipeline_size}, pipeline_schedule={self._schedule!r},"
            f" pipeline_microbatches={self._microbatches}, pipeline_stages_per_rank={self._stages_per_rank},"
            if self._pipeline_size > 1
            else ""
        )
        return (
            f"{type(self).__name__}(parallelize_fn={getattr(self._parallelize_fn, '__name__', '?')},"
            f" data_parallel_size={self._data_parallel_size!r}, tensor_parallel_size={self._tensor_parallel_size!r},"
            f" data_parallel_replicate_size={self._replicate_size},{pipeline}"
            f" save_distributed_checkpoint={self._save_distributed_checkpoint})"
        )


def _check_pipeline(size: int, microbatches: int | None, split_fn: Any, save_distributed: bool) -> None:
    """Refuse pipeline arguments that cannot work, before any process starts."""
    if type(size) is not int or size < 1:
        raise ValueError(f"ModelParallelStrategy(pipeline_parallel_size={size!r}): expected a positive int (1: none).")
    if microbatches is not None and (type(microbatches) is not int or microbatches < 1):
        raise ValueError(
            f"ModelParallelStrategy(pipeline_microbatches={microbatches!r}): expected a positive int, or None for one"
            " micro-batch per stage."
        )
    if split_fn is not None and not callable(split_fn):
        raise TypeError(
            f"ModelParallelStrategy(split_fn={split_fn!r}): expected a function fn(model, stage_indices, num_stages)"
            " returning one module per stage index, or None for parallelize.split_transformer."
        )
    if size > 1 and not save_distributed:
        raise ValueError(
            f"ModelParallelStrategy(pipeline_parallel_size={size}, save_distributed_checkpoint=False): each pipeline"
            " rank holds other layers, so fabric.save writes a folder of shards. Leave save_distributed_checkpoint"
            " True and turn the folder into one file with `fabric-lite consolidate FOLDER`."
        )


def _check_precision(name: str) -> None:
    """Refuse a precision that the strategy does not run (one of :data:`_PRECISIONS`)."""
    if name not in _PRECISIONS:
        raise ValueError(
            f"ModelParallelStrategy does not support Fabric(..., precision={name!r}): choose one of"
            f" {', '.join(_PRECISIONS)}."
        )


class _ParallelBackwardSyncControl(_NestedSyncSwitch):
    """``ModelParallelStrategy``'s ``no_backward_sync`` (Lightning's name): FSDP2's gradient reduction off while the
    outermost block is open; tensor-parallel collectives always run."""


def _setup_device_mesh(shape: tuple[int, ...], device_type: str, pipeline: bool = False) -> DeviceMesh:
    """The mesh for ``shape``: ``("data_parallel", "tensor_parallel")``, or with HSDP ``("data_parallel_replicate",
    "data_parallel_shard", "tensor_parallel")`` with ``"data_parallel"`` the flattened pair; with ``pipeline``,
    ``"pipeline_parallel"`` first. Every rank must call it (it creates the dimensions' process groups)."""
    from torch.distributed.device_mesh import init_device_mesh

    names = (DATA_PARALLEL, TENSOR_PARALLEL) if len(shape) - pipeline == 2 else (REPLICATE, SHARD, TENSOR_PARALLEL)
    mesh = init_device_mesh(device_type, shape, mesh_dim_names=(PIPELINE_PARALLEL, *names) if pipeline else names)
    if REPLICATE in names:
        mesh[REPLICATE, SHARD]._flatten(DATA_PARALLEL)  # as torchtitan does: "data_parallel" is the pair
    # one group over the dimensions a parameter is sharded on: a DTensor reduced over them (the gradient norm of a
    # 2-D sharded model) then takes one all-reduce instead of one per dimension
    mesh[names]._flatten(_ALL)
    return mesh


def _load_raw_module_state(
    state_dict: dict[str, Any], module: Module, world_size: int = 1, strict: bool = True
) -> None:
    """Load a full state dict into ``module``, parallelised or plain, every rank keeping its own shards (Lightning's
    helper; ``world_size`` is unused). Every rank must call it when the module is sharded.

    Raises:
        KeyError: with ``strict``, the keys of the module and of ``state_dict`` differ.
    """
    sharded.load_full_module_state(module, state_dict, strict)
