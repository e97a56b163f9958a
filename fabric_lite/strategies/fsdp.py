"""Fully sharded data parallel on torch's ``fully_shard`` (FSDP2): each rank holds 1/N of the parameters, gradients
and optimizer state, and all-gathers a unit's parameters only while that unit computes."""

from __future__ import annotations

import inspect
import itertools
from datetime import timedelta
from functools import partial
from typing import TYPE_CHECKING, Any, Literal

import torch
from torch import Tensor
from torch.nn import Module
from torch.optim import Optimizer
from typing_extensions import override

from fabric_lite.accelerators import Accelerator
from fabric_lite.plugins.environments import ClusterEnvironment
from fabric_lite.plugins.precision import FSDPPrecision, Precision
from fabric_lite.plugins.precision.fsdp import FSDP_PRECISIONS, mixed_precision_policy
from fabric_lite.strategies import _fsdp_options, _fsdp_setup, _model_parallel_ops
from fabric_lite.strategies._fsdp_lightning import _check_sharded, _FSDPBackwardSyncControl
from fabric_lite.strategies._fsdp_lightning import _get_full_state_dict_context as _get_full_state_dict_context
from fabric_lite.strategies._fsdp_lightning import _is_sharded_checkpoint as _is_sharded_checkpoint
from fabric_lite.strategies._fsdp_options import FSDP1_ARGUMENTS, ShardingStrategyName
from fabric_lite.strategies._fsdp_setup import AutoWrapPolicy, ParamInitFn
from fabric_lite.strategies.parallel import ParallelStrategy, default_pg_timeout
from fabric_lite.strategies.strategy import _set_gradient_sync, _Sharded

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import CPUOffload, CPUOffloadPolicy, MixedPrecisionPolicy, ShardingStrategy
    from torch.distributed.fsdp import MixedPrecision as FSDP1MixedPrecision

_STATE_DICT_TYPES = ("sharded", "full")
#: arguments of ``fully_shard`` that the strategy sets itself
_OWN_ARGUMENTS = ("module", "mesh", "reshard_after_forward", "mp_policy", "offload_policy")


class FSDPStrategy(_Sharded, ParallelStrategy):
    """Fully sharded data parallel with torch's ``fully_shard`` (FSDP2), on CUDA with NCCL or on the CPU with gloo.

    Sharding replaces the parameters, so create the optimizer after :meth:`setup_module` or set both up with
    ``fabric.setup``. A meta-device model is initialised at setup in construction order, so its values equal an
    eager construction's with the same seed. Inside ``fabric.no_backward_sync`` every rank keeps full-size gradients.

    Args:
        accelerator, parallel_devices, cluster_environment, precision, process_group_backend, timeout: as for
            :class:`ParallelStrategy`.
        cpu_offload: keep the shards, gradients and optimizer step on the CPU (``True`` or a policy).
        mixed_precision: a ``MixedPrecisionPolicy`` (or FSDP1's ``MixedPrecision``); by default the precision's.
        auto_wrap_policy: the sharded units: a set of layer classes, ``fn(module) -> bool``, a minimum number of
            parameters, or an FSDP1 policy. ``None``: the whole model is the only unit.
        activation_checkpointing: deprecated, as in Lightning: ``activation_checkpointing_policy={...}``.
        activation_checkpointing_policy: the layers recomputed in backward, in any form ``auto_wrap_policy`` takes.
        sharding_strategy: ``"FULL_SHARD"`` (default), ``"SHARD_GRAD_OP"``, ``"NO_SHARD"``, ``"HYBRID_SHARD"``
            (shard within a node, replicate across nodes), ``"_HYBRID_SHARD_ZERO2"``, or FSDP1's ``ShardingStrategy``.
        state_dict_type: what ``fabric.save`` writes: ``"sharded"`` (a folder) or ``"full"`` (one file).
        device_mesh: a ``(replicate, shard)`` tuple of sizes whose product is the world size, or a 2-D
            ``DeviceMesh``, for the hybrid strategies; a 1-D ``DeviceMesh`` for ``FULL_SHARD``/``SHARD_GRAD_OP``.
        reshard_after_forward: free a unit's gathered parameters after its forward (``True``) or keep them until
            backward (``False``); ``None``: what ``sharding_strategy`` implies.
        param_init_fn: ``fn(module)`` initialising the tensors ``module`` itself holds, else ``reset_parameters()``.
        start_method: ``"popen"`` re-runs the script; ``"spawn"``/``"fork"`` run ``launch(fn)`` in new processes.
        **kwargs: FSDP1's arguments (:class:`~fabric_lite.strategies._fsdp_options.FSDP1Options`) and any other
            ``fully_shard`` argument.

    Raises:
        ValueError, TypeError: an argument that is not accepted.

    Example::

        fabric = Fabric(strategy=FSDPStrategy(auto_wrap_policy={Block}), devices=2)
    """

    shards_parameters = True

    def __init__(
        self,
        accelerator: Accelerator | None = None,
        parallel_devices: list[torch.device] | None = None,
        cluster_environment: ClusterEnvironment | None = None,
        precision: Precision | None = None,
        process_group_backend: str | None = None,
        timeout: timedelta | None = default_pg_timeout,
        cpu_offload: bool | CPUOffloadPolicy | CPUOffload | None = None,
        mixed_precision: MixedPrecisionPolicy | FSDP1MixedPrecision | None = None,
        auto_wrap_policy: AutoWrapPolicy = None,
        activation_checkpointing: type[Module] | list[type[Module]] | None = None,
        activation_checkpointing_policy: AutoWrapPolicy = None,
        sharding_strategy: ShardingStrategyName | ShardingStrategy = "FULL_SHARD",
        state_dict_type: Literal["sharded", "full"] = "sharded",
        device_mesh: tuple[int, int] | DeviceMesh | None = None,
        *,
        reshard_after_forward: bool | None = None,
        param_init_fn: ParamInitFn | None = None,
        start_method: Literal["popen", "spawn", "fork"] = "popen",
        **kwargs: Any,
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
            from torch.distributed.fsdp import fully_shard
        except ImportError as err:
            raise ImportError(
                f"FSDPStrategy needs torch.distributed.fsdp.fully_shard (torch >= 2.6); this is torch"
                f" {torch.__version__}. Upgrade torch, or use strategy='ddp'."
            ) from err
        self.precision = precision  # checked: FSDPPrecision only
        self._set_start_method(start_method)
        if reshard_after_forward is not None and not isinstance(reshard_after_forward, bool):
            raise TypeError(
                f"FSDPStrategy(reshard_after_forward={reshard_after_forward!r}): expected True, False or None."
            )
        if param_init_fn is not None and not callable(param_init_fn):
            raise TypeError(f"FSDPStrategy(param_init_fn={param_init_fn!r}): expected a function fn(module).")
        #: FSDP1's arguments as given, Lightning's ``_fsdp_kwargs`` (``use_orig_params`` is ``True`` unless given)
        self._fsdp_kwargs = {"use_orig_params": True, **{k: v for k, v in kwargs.items() if k in FSDP1_ARGUMENTS}}
        if device_mesh is not None:
            self._fsdp_kwargs["device_mesh"] = device_mesh
        self._fsdp1, kwargs = _fsdp_options.fsdp1_options(kwargs)
        accepted = [name for name in inspect.signature(fully_shard).parameters if name not in _OWN_ARGUMENTS]
        unknown = sorted(set(kwargs) - set(accepted))
        if unknown:
            raise TypeError(
                f"FSDPStrategy got unexpected keyword argument(s) {unknown}. Besides its own arguments it takes"
                f" FSDP1's {list(_fsdp_options.FSDP1_ARGUMENTS)}, and passes these to"
                f" torch.distributed.fsdp.fully_shard: {accepted}."
            )
        self._sharding_strategy, self._reshard_after_forward = _fsdp_options.sharding_setting(
            sharding_strategy, reshard_after_forward, device_mesh, self._fsdp1.process_group
        )
        self._auto_wrap_policy = _fsdp_setup.check_wrap_policy(auto_wrap_policy)
        self._checkpointing = _fsdp_options.checkpointing_policy(
            activation_checkpointing, activation_checkpointing_policy
        )
        #: ``mixed_precision`` as given, for Lightning's :attr:`mixed_precision_config`
        self._mixed_precision_argument = mixed_precision
        self._mixed_precision = _fsdp_options.mixed_precision_setting(mixed_precision)
        #: ``True`` becomes a ``CPUOffloadPolicy`` at setup, pinning memory when the device is a GPU
        self._cpu_offload: CPUOffloadPolicy | bool = _fsdp_options.cpu_offload_setting(cpu_offload)
        self._param_init_fn = param_init_fn
        self.state_dict_type = state_dict_type
        #: the other keyword arguments, passed to ``fully_shard``
        self._fully_shard_extra = kwargs
        #: the mesh as given: a (replicate, shard) tuple is built into a ``DeviceMesh`` by ``setup_environment``
        self._mesh_argument = device_mesh
        self._backward_sync_control = _FSDPBackwardSyncControl(self._sync_target, _set_gradient_sync)

    # ------------------------------------------------------------------ configuration
    @classmethod
    @override
    def _check_choices(cls, *, label: str, accelerator: str, precision: str) -> None:
        """Refuse a precision that :class:`FSDPPrecision` does not run (``"64-true"``)."""
        if precision not in FSDP_PRECISIONS:
            raise ValueError(
                f"precision={precision!r} is not supported with strategy={label!r}: FSDPPrecision runs one of"
                f" {', '.join(map(repr, FSDP_PRECISIONS))}."
            )

    @classmethod
    @override
    def _named_precision(cls, name: str) -> Precision | None:
        """``Fabric(strategy="fsdp", precision=name)`` runs ``FSDPPrecision(name)``, as in Lightning."""
        return FSDPPrecision(name) if name in FSDP_PRECISIONS else None  # type: ignore[arg-type]

    @property
    @override
    def precision(self) -> FSDPPrecision:
        """The :class:`FSDPPrecision` plugin (``"32-true"`` unless ``Fabric(precision=...)`` says otherwise); setting
        a plugin of another class raises ``TypeError``, as in Lightning."""
        plugin = self._precision
        return plugin if isinstance(plugin, FSDPPrecision) else FSDPPrecision("32-true")

    @precision.setter
    def precision(self, precision: Precision | None) -> None:
        if precision is not None and not isinstance(precision, FSDPPrecision):
            raise TypeError(
                f"The FSDP strategy can only work with the `FSDPPrecision` plugin, found {type(precision).__name__}"
                f"(precision={getattr(precision, 'precision', None)!r}). Pass Fabric(strategy='fsdp', precision=...)"
                f" with one of {', '.join(map(repr, FSDP_PRECISIONS))}, or plugins=[FSDPPrecision(...)]."
            )
        self._precision = precision

    @property
    @override
    def state_dict_type(self) -> str:
        """What ``fabric.save`` writes: ``"sharded"`` (a folder, every rank its shards) or ``"full"`` (one file).
        Settable, e.g. to save a full copy at the end of training."""
        return self._state_dict_type

    @state_dict_type.setter
    def state_dict_type(self, value: str) -> None:
        if value not in _STATE_DICT_TYPES:
            raise ValueError(
                f"FSDPStrategy(state_dict_type={value!r}) is not one of {_STATE_DICT_TYPES}: 'sharded' writes a folder"
                " with every rank's shards, 'full' writes one file from rank 0."
            )
        self._state_dict_type = value

    @property
    def mixed_precision(self) -> MixedPrecisionPolicy:
        """The ``MixedPrecisionPolicy`` in use: the one given, or the one that matches the precision."""
        if self._mixed_precision is not None:
            return self._mixed_precision
        return mixed_precision_policy(self.precision.precision)

    @property
    def mixed_precision_config(self) -> MixedPrecisionPolicy | FSDP1MixedPrecision:
        """The ``mixed_precision`` argument as given, or else the plugin's, as in Lightning; ``fully_shard`` gets
        :attr:`mixed_precision`."""
        given = self._mixed_precision_argument
        return given if given is not None else self.precision.mixed_precision_config

    @property
    def cpu_offload(self) -> CPUOffload | CPUOffloadPolicy | bool:
        """Whether the shards live on the CPU: the ``CPUOffloadPolicy`` given, else FSDP1's ``CPUOffload`` (a bool
        where torch has no FSDP1)."""
        if not isinstance(self._cpu_offload, bool):
            return self._cpu_offload
        fsdp1 = _fsdp_options._fsdp1_class("CPUOffload")
        return fsdp1(offload_params=self._cpu_offload) if fsdp1 is not None else self._cpu_offload

    @property
    def sharding_strategy(self) -> ShardingStrategy | str:
        """The ``sharding_strategy`` as FSDP1's ``ShardingStrategy`` member (its name where torch has no FSDP1)."""
        fsdp1 = _fsdp_options._fsdp1_class("ShardingStrategy")
        return fsdp1[self._sharding_strategy] if fsdp1 is not None else self._sharding_strategy

    @property
    def device_mesh(self) -> DeviceMesh:
        """The mesh ``fully_shard`` gets: ``("shard",)`` over all ranks, or ``("replicate", "shard")`` for the hybrid
        strategies and ``NO_SHARD``.

        Raises:
            RuntimeError: there is no process group yet.
            ValueError: the mesh does not cover the world size.
        """
        if self._device_mesh is None:
            self._device_mesh = self._build_mesh()
        return self._device_mesh

    @override
    def _build_mesh(self) -> DeviceMesh:
        import torch.distributed as dist
        from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

        if not dist.is_initialized():
            raise RuntimeError("FSDPStrategy needs the process group: call fabric.launch() first.")
        if self._fsdp1.process_group is not None:
            return _fsdp_options.mesh_from_process_group(self._fsdp1.process_group, self.root_device.type)
        given = self._mesh_argument
        if isinstance(given, DeviceMesh):
            if given.size() != self.world_size:
                raise ValueError(
                    f"FSDPStrategy(device_mesh={given!r}) spans {given.size()} ranks, but the world size is"
                    f" {self.world_size}. Pass a mesh over all {self.world_size} ranks."
                )
            return given
        shape = _fsdp_options.mesh_shape(self._sharding_strategy, given, self.world_size, self.num_nodes)
        names = ("replicate", "shard") if len(shape) == 2 else ("shard",)
        return init_device_mesh(self.root_device.type, shape, mesh_dim_names=names)

    @override
    def setup_environment(self) -> None:
        super().setup_environment()
        self.precision._set_device_type(self.root_device.type)  # its autocast (and created scaler) follow this device

    def _fully_shard_kwargs(self, ignored: set[torch.nn.Parameter]) -> dict[str, Any]:
        kwargs: dict[str, Any] = {
            "mesh": self.device_mesh,
            "mp_policy": self.mixed_precision,
            **self._fully_shard_extra,
        }
        if ignored:
            kwargs["ignored_params"] = ignored | set(kwargs.get("ignored_params") or ())
        if self._reshard_after_forward is not None:
            kwargs["reshard_after_forward"] = self._reshard_after_forward
        if self._cpu_offload is True:
            from torch.distributed.fsdp import CPUOffloadPolicy

            kwargs["offload_policy"] = CPUOffloadPolicy(pin_memory=self.root_device.type == "cuda")
        elif self._cpu_offload:
            kwargs["offload_policy"] = self._cpu_offload
        return kwargs

    # ------------------------------------------------------------------ modules and optimizers
    @override
    def setup_module(self, module: Module) -> Module:
        """Shard ``module`` in place (the ``auto_wrap_policy`` units, then the whole module) and materialise it if it
        is on the meta device.

        Raises:
            RuntimeError: the module holds meta-device and real tensors at once.
        """
        from torch.distributed.fsdp import FSDPModule, fully_shard

        self._use_sharded_grad_scaler()
        owners = _fsdp_setup.meta_owners(module)
        if owners:
            _fsdp_setup.check_initialisable(module, owners, self._param_init_fn)
        sync = self._fsdp1.sync_module_states and self.world_size > 1
        ignored = self._fsdp1.ignored_params()
        if not isinstance(module, FSDPModule):  # a module the user sharded already keeps their settings
            if sync and not owners:  # rank 0's values everywhere, before each rank keeps its shards
                _fsdp_setup.broadcast_from_rank_zero([*module.parameters(), *module.buffers()], self.root_device)
            if self._checkpointing:  # before sharding, as torch requires
                _fsdp_setup.apply_activation_checkpointing(module, self._checkpointing)
            kwargs = self._fully_shard_kwargs(ignored)
            for unit in _fsdp_setup.wrap_targets(module, self._auto_wrap_policy):
                if not isinstance(unit, FSDPModule):
                    fully_shard(unit, **kwargs)
            fully_shard(module, **kwargs)
            if self._fsdp1.forward_prefetch:
                for unit, following in itertools.pairwise([m for m in module.modules() if isinstance(m, FSDPModule)]):
                    unit.set_modules_to_forward_prefetch([following])
        if owners:
            # offloaded shards live on the CPU; only the buffers (never sharded) belong on the device
            shard_device = torch.device("cpu") if self._cpu_offload else self.root_device
            _fsdp_setup.materialize(
                module,
                owners,
                shard_device,
                self._param_init_fn,
                buffer_device=self.root_device,
                sync=partial(_fsdp_setup.broadcast_from_rank_zero, device=self.root_device) if sync else None,
            )
        if ignored:  # fully_shard leaves the parameters it ignores where they are
            _model_parallel_ops.move_leftovers(module, self.root_device)
        self._modules.add(module)
        return module

    @override
    def setup_module_and_optimizers(
        self, module: Module, optimizers: list[Optimizer], scheduler: Any = None
    ) -> tuple[Module, list[Optimizer], Any]:
        """As :meth:`_Sharded.setup_module_and_optimizers`.

        Raises:
            ValueError: ``use_orig_params=False`` was given (FSDP1's flat parameters), or an optimizer already holds
                state.
        """
        if self._fsdp_kwargs.get("use_orig_params") is False:
            raise ValueError(
                f"You set `{type(self).__name__}(use_orig_params=False)` but this is not supported when setting the"
                " model and optimizer up together: FSDP1's flat parameters cannot be updated by an optimizer created"
                " before them. Leave use_orig_params out (FSDP2 keeps the original parameters), or set the module up"
                " first: model = fabric.setup_module(model); optimizer ="
                " fabric.setup_optimizers(torch.optim.AdamW(model.parameters()))."
            )
        return super().setup_module_and_optimizers(module, optimizers, scheduler)

    @override
    def _parameters_after_setup(self, module: Module, set_up: Module) -> Module:
        """``module``: ``fully_shard`` shards it in place (:meth:`setup_module` returns it)."""
        return module

    def _use_sharded_grad_scaler(self) -> None:
        """Replace the plugin's plain ``GradScaler`` by a ``ShardedGradScaler`` with its settings and state, so every
        rank skips the step when any shard holds inf/NaN."""
        precision = self.precision
        plain = precision.scaler
        if type(plain) is not torch.amp.GradScaler:
            return
        from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

        sharded = ShardedGradScaler(device=precision._device_type, enabled=plain.is_enabled())
        if plain.is_enabled():  # the scale, its growth settings and tracker
            sharded.load_state_dict(plain.state_dict())
        precision.scaler = sharded

    # ------------------------------------------------------------------ training
    @override
    def _sync_target(self, module: Module) -> Module:
        """``module`` itself, for ``no_backward_sync``; ``TypeError`` if it is not sharded."""
        _check_sharded(module, "Blocking backward sync", f"{type(self).__name__}.no_backward_sync")
        return module

    @override
    def clip_gradients_norm(
        self,
        module: Module,
        optimizer: Optimizer,
        max_norm: float,
        norm_type: float = 2.0,
        error_if_nonfinite: bool = True,
    ) -> Tensor:
        """Clip by the total norm over all shards; return it before clipping, a plain tensor equal on every rank.

        Raises:
            TypeError: ``module`` is not sharded (not set up by ``fabric.setup_module``).
        """
        _check_sharded(module, "Gradient clipping with FSDP", f"{type(self).__name__}.clip_gradients_norm")
        norm = super().clip_gradients_norm(module, optimizer, max_norm, norm_type, error_if_nonfinite)
        from torch.distributed.tensor import DTensor

        return norm.full_tensor() if isinstance(norm, DTensor) else norm

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(sharding_strategy={self._sharding_strategy!r},"
            f" auto_wrap_policy={self._auto_wrap_policy!r}, state_dict_type="
            f"{self._state_dict_type!r}, start_method={self._start_method!r})"
        )
