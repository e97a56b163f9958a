"""Lightning's FSDP1-shaped ``FSDPStrategy`` arguments, checked and mapped onto ``fully_shard`` (FSDP2)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Literal, TypeAlias, get_args

import torch
from torch.nn import Module, Parameter

from fabric_lite.strategies._fsdp_setup import AutoWrapPolicy, check_wrap_policy, module_classes
from fabric_lite.utilities.rank_zero import rank_zero_deprecation, rank_zero_warn

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy

ShardingStrategyName: TypeAlias = Literal[
    "FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD", "_HYBRID_SHARD_ZERO2"
]
SHARDING_STRATEGIES: tuple[str, ...] = get_args(ShardingStrategyName)
_HYBRID = ("HYBRID_SHARD", "_HYBRID_SHARD_ZERO2")
#: the strategies that keep gathered parameters until backward (ZeRO-2): ``reshard_after_forward=False``
_KEEP_GATHERED = ("SHARD_GRAD_OP", "_HYBRID_SHARD_ZERO2", "NO_SHARD")


def cpu_offload_setting(value: Any) -> bool | CPUOffloadPolicy:
    """``cpu_offload`` as a bool or ``CPUOffloadPolicy`` (``None`` is ``False``; FSDP1's ``CPUOffload`` its
    ``offload_params``); ``TypeError`` for any other value."""
    from torch.distributed.fsdp import CPUOffloadPolicy

    if value is None:
        return False
    if isinstance(value, (bool, CPUOffloadPolicy)):
        return value
    fsdp1 = _fsdp1_class("CPUOffload")
    if fsdp1 is not None and isinstance(value, fsdp1):
        return bool(value.offload_params)
    raise TypeError(
        f"FSDPStrategy(cpu_offload={value!r}): expected True, False, None, a torch.distributed.fsdp.CPUOffloadPolicy"
        " or a torch.distributed.fsdp.CPUOffload."
    )


def mixed_precision_setting(value: Any) -> MixedPrecisionPolicy | None:
    """``mixed_precision`` as a ``MixedPrecisionPolicy`` (``None``: follow ``Fabric(precision=...)``). FSDP1's
    ``MixedPrecision`` maps by its dtypes and input casting; its fields FSDP2 lacks (``buffer_dtype``,
    ``keep_low_precision_grads``, ``_module_classes_to_ignore``) are dropped with a warning.

    Raises:
        TypeError: any other value.
    """
    from torch.distributed.fsdp import MixedPrecisionPolicy

    if value is None or isinstance(value, MixedPrecisionPolicy):
        return value
    fsdp1 = _fsdp1_class("MixedPrecision")
    if fsdp1 is None or not isinstance(value, fsdp1):
        raise TypeError(
            f"FSDPStrategy(mixed_precision={value!r}): expected a torch.distributed.fsdp.MixedPrecisionPolicy (or"
            " FSDP1's torch.distributed.fsdp.MixedPrecision), or None to follow Fabric(precision=...)."
        )
    defaults = {f.name: f.default for f in dataclasses.fields(fsdp1)}
    dropped = [
        f"{name}={getattr(value, name)!r}"
        for name in ("buffer_dtype", "keep_low_precision_grads", "_module_classes_to_ignore")
        if name in defaults and getattr(value, name) != defaults[name]
    ]
    if dropped:
        rank_zero_warn(
            f"FSDPStrategy(mixed_precision=MixedPrecision(...)): {', '.join(dropped)} has no equivalent in"
            " torch's fully_shard (FSDP2) and is ignored; only param_dtype, reduce_dtype and the input casting are"
            " used. Pass a torch.distributed.fsdp.MixedPrecisionPolicy to silence this warning.",
            category=UserWarning,
            stacklevel=6,  # the caller of FSDPStrategy(...)
        )
    return MixedPrecisionPolicy(
        param_dtype=value.param_dtype,
        reduce_dtype=value.reduce_dtype,
        cast_forward_inputs=bool(value.cast_forward_inputs or value.cast_root_forward_inputs),
    )


def checkpointing_policy(activation_checkpointing: Any, activation_checkpointing_policy: Any) -> AutoWrapPolicy:
    """Which layers to checkpoint: ``activation_checkpointing_policy`` (any form ``auto_wrap_policy`` takes), or
    the deprecated ``activation_checkpointing`` (a class or list of classes), which warns as Lightning does.

    Raises:
        ValueError: both are given.
        TypeError: a value that is not a policy.
    """
    if activation_checkpointing is not None and activation_checkpointing_policy is not None:
        raise ValueError(
            "You cannot set both `activation_checkpointing` and `activation_checkpointing_policy`. Use the latter:"
            f" FSDPStrategy(activation_checkpointing_policy={activation_checkpointing_policy!r})."
        )
    if activation_checkpointing is not None:
        classes = module_classes(activation_checkpointing, "activation_checkpointing")
        rank_zero_deprecation(
            f"`FSDPStrategy(activation_checkpointing={activation_checkpointing})` is deprecated, use "
            f"`FSDPStrategy(activation_checkpointing_policy={set(classes)})` instead.",
            stacklevel=7,  # the caller of FSDPStrategy(...)
        )
        return set(classes)
    return check_wrap_policy(activation_checkpointing_policy, "activation_checkpointing_policy")


def sharding_setting(
    sharding_strategy: Any, reshard_after_forward: bool | None, device_mesh: Any, process_group: Any = None
) -> tuple[str, bool | None]:
    """The sharding strategy's upper-case name (from any case or FSDP1's member) and ``fully_shard``'s
    ``reshard_after_forward``: as given, or ``False`` for the strategies in :data:`_KEEP_GATHERED`.

    Raises:
        ValueError: an unknown strategy, ``reshard_after_forward=True`` with a strategy that keeps parameters
            gathered, a ``device_mesh`` or ``process_group`` with a strategy that has no use for it, or both.
        TypeError: a ``device_mesh`` that is neither a (replicate, shard) tuple of sizes nor a ``DeviceMesh``.
    """
    name = _strategy_name(sharding_strategy)
    if name in _KEEP_GATHERED:
        if reshard_after_forward:
            raise ValueError(
                f"FSDPStrategy(sharding_strategy={sharding_strategy!r}, reshard_after_forward=True) conflict:"
                f" {name} keeps each unit's gathered parameters until backward (reshard_after_forward=False). Drop"
                " reshard_after_forward, or use sharding_strategy='FULL_SHARD' (or 'HYBRID_SHARD') to reshard."
            )
        reshard_after_forward = False
    _check_device_mesh(device_mesh, name)
    if process_group is not None:
        _check_process_group(process_group, name, device_mesh)
    return name, reshard_after_forward


def mesh_shape(name: str, device_mesh: tuple[int, int] | None, world_size: int, num_nodes: int) -> tuple[int, ...]:
    """The mesh shape for strategy ``name`` without a given ``DeviceMesh``: ``(world_size,)``; ``(world_size, 1)``
    for ``NO_SHARD``; for the hybrid ones the ``device_mesh`` tuple, or ``(num_nodes, world_size // num_nodes)``.

    Raises:
        ValueError: the sizes do not multiply to the world size.
    """
    if name == "NO_SHARD":
        return (world_size, 1)
    if name not in _HYBRID:
        return (world_size,)
    if device_mesh is None:
        if num_nodes < 1 or world_size % num_nodes:
            raise ValueError(
                f"FSDPStrategy(sharding_strategy={name!r}) shards within a node and replicates across nodes, but"
                f" the world size {world_size} is not a multiple of num_nodes={num_nodes}. Pass"
                " device_mesh=(replicate, shard) sizes whose product is the world size."
            )
        return (num_nodes, world_size // num_nodes)
    replicate, shard = device_mesh
    if replicate * shard != world_size:
        raise ValueError(
            f"FSDPStrategy(device_mesh={device_mesh!r}): {replicate} x {shard} = {replicate * shard} devices, but the"
            f" world size is {world_size}. Pass (replicate, shard) sizes whose product is {world_size}."
        )
    return (replicate, shard)


def _strategy_name(value: Any) -> str:
    fsdp1 = _fsdp1_class("ShardingStrategy")
    if fsdp1 is not None and isinstance(value, fsdp1):
        return str(value.name)
    if isinstance(value, str) and value.upper() in SHARDING_STRATEGIES:
        return value.upper()
    raise ValueError(
        f"FSDPStrategy(sharding_strategy={value!r}) is not one of {SHARDING_STRATEGIES} (any case), nor a"
        " torch.distributed.fsdp.ShardingStrategy."
    )


def _check_device_mesh(device_mesh: Any, name: str) -> None:
    if device_mesh is None:
        return
    from torch.distributed.device_mesh import DeviceMesh

    if isinstance(device_mesh, DeviceMesh):
        dims = device_mesh.ndim
    elif (
        isinstance(device_mesh, tuple)
        and len(device_mesh) == 2
        and all(isinstance(n, int) and not isinstance(n, bool) and n >= 1 for n in device_mesh)
    ):
        dims = 2
    else:
        raise TypeError(
            f"FSDPStrategy(device_mesh={device_mesh!r}): expected a tuple (replicate, shard) of positive sizes, e.g."
            " device_mesh=(2, 4), or a torch.distributed.device_mesh.DeviceMesh."
        )
    expected = 2 if name in _HYBRID else 1 if name in ("FULL_SHARD", "SHARD_GRAD_OP") else 0
    if dims != expected:
        raise ValueError(
            f"FSDPStrategy(sharding_strategy={name!r}, device_mesh={device_mesh!r}): a {dims}-D mesh does not fit"
            f" {name}. A (replicate, shard) mesh needs sharding_strategy='HYBRID_SHARD' (or '_HYBRID_SHARD_ZERO2');"
            " FULL_SHARD and SHARD_GRAD_OP take a 1-D DeviceMesh; NO_SHARD takes none."
        )


def _check_process_group(process_group: Any, name: str, device_mesh: Any) -> None:
    from torch.distributed import ProcessGroup

    if device_mesh is not None:
        raise ValueError(
            "The arguments `FSDPStrategy(process_group=..., device_mesh=...)` are mutually exclusive: both say which"
            f" ranks shard the model (got process_group={process_group!r}, device_mesh={device_mesh!r}). Pass only"
            " one of them."
        )
    pair = isinstance(process_group, tuple) and len(process_group) == 2
    if not isinstance(process_group, ProcessGroup) and not (
        pair and all(isinstance(g, ProcessGroup) for g in process_group)
    ):
        raise TypeError(
            f"FSDPStrategy(process_group={process_group!r}): expected a torch.distributed.ProcessGroup to shard over,"
            " or for the hybrid strategies a tuple (shard group within a node, replicate group across nodes)."
        )
    if name in _HYBRID and not pair:
        raise ValueError(
            f"FSDPStrategy(sharding_strategy={name!r}, process_group=...): a hybrid strategy takes a tuple of two"
            " groups, (shard group within a node, replicate group across nodes), as FSDP1 does."
        )
    if name == "NO_SHARD":
        raise ValueError(
            f"FSDPStrategy(sharding_strategy={name!r}, process_group=...): NO_SHARD replicates over every rank and"
            " takes no group; use DDPStrategy(process_group=...) to replicate over a group."
        )
    if name not in _HYBRID and pair:
        raise ValueError(
            f"FSDPStrategy(sharding_strategy={name!r}, process_group=...): a tuple of two groups needs"
            f" sharding_strategy='HYBRID_SHARD' (or '_HYBRID_SHARD_ZERO2'); {name} takes one group."
        )


def mesh_from_process_group(process_group: Any, device_type: str) -> DeviceMesh:
    """The mesh of FSDP1's ``process_group``: ``("shard",)`` over one group, or ``("replicate", "shard")`` over a
    hybrid ``(shard, replicate)`` pair, laid out as a grid of shifted shard groups.

    Raises:
        ValueError: the two groups do not form such a grid around this rank.
    """
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh

    if not isinstance(process_group, tuple):
        return DeviceMesh.from_group(process_group, device_type, mesh_dim_names=("shard",))
    shard, replicate = process_group
    me = dist.get_rank()
    shard_ranks, replicate_ranks = dist.get_process_group_ranks(shard), dist.get_process_group_ranks(replicate)
    layout = [[s - me + r for s in shard_ranks] for r in replicate_ranks]
    flat = [rank for row in layout for rank in row]
    if me not in shard_ranks or me not in replicate_ranks or len(set(flat)) != len(flat) or min(flat) < 0:
        raise ValueError(
            f"FSDPStrategy(process_group=(shard, replicate)): on rank {me} the shard group {shard_ranks} and the"
            f" replicate group {replicate_ranks} do not form a grid (replicate x shard ranks, each shard group the"
            " others shifted). Pass the groups of such a grid, or device_mesh=(replicate, shard) sizes."
        )
    return DeviceMesh.from_group(
        [replicate, shard], device_type, mesh=torch.tensor(layout), mesh_dim_names=("replicate", "shard")
    )


#: FSDP1's ``FullyShardedDataParallel`` arguments that Lightning takes through ``FSDPStrategy(**kwargs)``, beyond the
#: ones ``FSDPStrategy`` names (``device_id`` is Lightning's own to set, and ``param_init_fn`` a named argument here)
FSDP1_ARGUMENTS = (
    "process_group",
    "backward_prefetch",
    "ignored_modules",
    "ignored_states",
    "sync_module_states",
    "forward_prefetch",
    "limit_all_gathers",
    "use_orig_params",
)


@dataclasses.dataclass(frozen=True)
class FSDP1Options:
    """FSDP1's arguments (:data:`FSDP1_ARGUMENTS`) as ``fully_shard`` uses them: ``process_group`` becomes the mesh;
    ``sync_module_states`` starts every rank from rank 0's values; ``forward_prefetch`` prefetches the next unit in
    ``model.modules()`` order; ``ignored`` (``ignored_modules``, ``ignored_states``) is left unsharded. FSDP2 has no
    switch for ``limit_all_gathers``, ``use_orig_params`` (always ``True``) or ``backward_prefetch`` (always
    ``BACKWARD_PRE``), so they are accepted without effect.
    """

    process_group: Any = None
    sync_module_states: bool = False
    forward_prefetch: bool = False
    ignored: tuple[Module | Parameter, ...] = ()

    def ignored_params(self) -> set[Parameter]:
        """The parameters left out of sharding: those given, and every parameter of the modules given."""
        params: set[Parameter] = set()
        for item in self.ignored:
            params.update(item.parameters() if isinstance(item, Module) else [item])
        return params


def fsdp1_options(kwargs: dict[str, Any]) -> tuple[FSDP1Options, dict[str, Any]]:
    """Take FSDP1's arguments out of ``kwargs``: the checked :class:`FSDP1Options` (``TypeError`` for a value FSDP1
    does not take either), and the rest, for ``fully_shard``."""
    rest = {k: v for k, v in kwargs.items() if k not in FSDP1_ARGUMENTS}
    for flag in ("sync_module_states", "forward_prefetch", "limit_all_gathers", "use_orig_params"):
        if flag in kwargs and not isinstance(kwargs[flag], bool):
            raise TypeError(f"FSDPStrategy({flag}={kwargs[flag]!r}): expected True or False.")
    prefetch = kwargs.get("backward_prefetch")
    backward_prefetch = _fsdp1_class("BackwardPrefetch")
    if prefetch is not None and not (backward_prefetch is not None and isinstance(prefetch, backward_prefetch)):
        raise TypeError(
            f"FSDPStrategy(backward_prefetch={prefetch!r}): expected a torch.distributed.fsdp.BackwardPrefetch or None."
        )
    ignored: list[Module | Parameter] = []
    for name, kinds in (("ignored_modules", (Module,)), ("ignored_states", (Module, Parameter))):
        value = kwargs.get(name)
        if value is None:
            continue
        items = list(value) if isinstance(value, Iterable) and not isinstance(value, (Module, torch.Tensor)) else None
        if items is None or not all(isinstance(item, kinds) for item in items):
            what = "modules" if name == "ignored_modules" else "parameters or modules"
            raise TypeError(f"FSDPStrategy({name}={value!r}): expected an iterable of {what} to leave unsharded.")
        ignored.extend(items)
    options = FSDP1Options(
        process_group=kwargs.get("process_group"),
        sync_module_states=bool(kwargs.get("sync_module_states", False)),
        forward_prefetch=bool(kwargs.get("forward_prefetch", False)),
        ignored=tuple(ignored),
    )
    return options, rest


def _fsdp1_class(name: str) -> Any:
    """FSDP1's class ``name``, or ``None`` where torch no longer has it."""
    try:
        import torch.distributed.fsdp as fsdp
    except ImportError:  # pragma: no cover - torch without distributed
        return None
    return getattr(fsdp, name, None)
