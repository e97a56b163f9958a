"""The strategy interface: how modules, optimizers, collectives and checkpoints behave across processes."""

from __future__ import annotations

import sys
import weakref
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager, ExitStack, nullcontext
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, TypeVar

import torch
from torch import Tensor
from torch.nn import Module
from torch.optim import Optimizer
from typing_extensions import override

from fabric_lite.accelerators import Accelerator
from fabric_lite.plugins.io.async_io import AsyncCheckpointIO
from fabric_lite.plugins.io.checkpoint_io import CheckpointIO
from fabric_lite.plugins.io.torch_io import TorchCheckpointIO
from fabric_lite.plugins.precision import Precision
from fabric_lite.runtime.checkpoint import CheckpointError, folders, sharded
from fabric_lite.runtime.checkpoint.entries import _apply_filter as _apply_filter  # Lightning's path
from fabric_lite.runtime.checkpoint.entries import pop_precision, restore_entries, to_state_dicts
from fabric_lite.runtime.run import announce_save
from fabric_lite.strategies import _fsdp_setup
from fabric_lite.strategies._backward_sync import _BackwardSyncControl, _NestedSyncSwitch
from fabric_lite.utilities._fs import _is_remote
from fabric_lite.utilities.apply_func import move_data_to_device
from fabric_lite.utilities.init import _EmptyInit
from fabric_lite.utilities.types import _PATH, ReduceOp, TBroadcast, TReduce

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

    from fabric_lite.plugins.environments import ClusterEnvironment
    from fabric_lite.strategies.launchers.launcher import Launcher


class _Compiler(Protocol):
    """The settings of a ``torch.compile`` call, applied again by :meth:`Strategy.compile_module`: compile a module
    whole, or some of its submodules in place."""

    def wrap(self, module: Module) -> Module: ...

    def compile_units(self, root: Module, units: Iterable[Module]) -> None: ...


_F = TypeVar("_F", bound=Callable[..., Any])


def _takes_collections(method: _F) -> _F:
    """Mark an ``all_reduce``/``all_gather`` that takes a whole collection at once (one collective per dtype).
    ``Fabric`` calls an unmarked override (Lightning's single-tensor contract) once per tensor."""
    method.__dict__["_takes_collections"] = True
    return method


class Strategy(ABC):
    """Base class of every strategy: device placement, backward and optimizer step (through the precision),
    collectives and checkpoints. An override keeps the contract of the method it overrides or raises
    ``NotImplementedError`` saying why.

    Args:
        accelerator: the kind of device; filled in by ``Fabric`` when not given.
        checkpoint_io: how checkpoint files are written and read (default :class:`TorchCheckpointIO`).
        precision: the precision plugin; filled in by ``Fabric`` when not given.

    Example::

        fabric = Fabric(accelerator="cpu", devices=2, strategy=DDPStrategy(timeout=timedelta(minutes=5)))
    """

    # Traits the plan and the build step read, on a registered class or an instance alike, so that they never name
    # a strategy class.
    #: whether the strategy runs one process per device (and needs ``fabric.launch()``)
    is_parallel: bool = False
    #: whether one process drives several devices (``DataParallel``), so that several devices need no extra process
    drives_several_devices: ClassVar[bool] = False
    #: whether setting a module up splits every parameter across the processes (so no layer may hold quantised
    #: weights, which cannot be split)
    shards_parameters: ClassVar[bool] = False
    #: the environment that always started this strategy's processes (``horovodrun``'s for Horovod), read instead
    #: of the detected one; ``None``: the environment is detected
    own_environment: ClassVar[type[ClusterEnvironment] | None] = None
    #: whether checkpoints go through a :class:`CheckpointIO`; a strategy that writes its own (sharded folders, a
    #: DeepSpeed engine's) refuses one, saying how it writes in ``_own_checkpoints``
    accepts_checkpoint_io: ClassVar[bool] = True
    _own_checkpoints: ClassVar[str] = ""
    #: whether a strategy that refuses a ``CheckpointIO`` takes ``AsyncCheckpointIO()`` (no inner IO) as the switch to
    #: writing its own checkpoints in the background (the sharding strategies' DCP ``async_save``)
    _saves_own_checkpoints_async: ClassVar[bool] = False
    #: whether a module and its optimizers must be set up together (``fabric.setup(model, optimizer)``), so that
    #: ``Fabric.setup_optimizers`` refuses before asking the strategy (DeepSpeed builds one engine of both)
    requires_joint_setup: ClassVar[bool] = False
    #: how :meth:`no_backward_sync` skips the gradient synchronisation (Lightning Fabric's attribute); ``None``: it
    #: is a no-op
    _backward_sync_control: _BackwardSyncControl | None = None

    def __init__(
        self,
        accelerator: Accelerator | None = None,
        checkpoint_io: CheckpointIO | None = None,
        precision: Precision | None = None,
    ) -> None:
        self._accelerator = accelerator
        self._checkpoint_io = _check_checkpoint_io(checkpoint_io, type(self).__name__)
        self._precision = precision
        self._launcher: Launcher | None = None

    # ------------------------------------------------------------------ identity and devices
    @property
    @abstractmethod
    def root_device(self) -> torch.device:
        """The device this process computes on."""

    @property
    def global_rank(self) -> int:
        """The index of this process among all processes, across nodes."""
        return 0

    @property
    def local_rank(self) -> int:
        """The index of this process among the processes on its node."""
        return 0

    @property
    def node_rank(self) -> int:
        """The index of this process's node."""
        return 0

    @property
    def world_size(self) -> int:
        """The number of processes across all nodes."""
        return 1

    @property
    def is_global_zero(self) -> bool:
        """Whether this is the process with global rank 0."""
        return self.global_rank == 0

    @property
    def accelerator(self) -> Accelerator | None:
        """The kind of device; set by ``Fabric`` when the strategy was created without one."""
        return self._accelerator

    @accelerator.setter
    def accelerator(self, accelerator: Accelerator) -> None:
        self._accelerator = accelerator

    @property
    def precision(self) -> Precision:
        """The precision plugin (full precision when none was given)."""
        return self._precision if self._precision is not None else Precision()

    @precision.setter
    def precision(self, precision: Precision | None) -> None:
        self._precision = precision

    @property
    def checkpoint_io(self) -> CheckpointIO:
        """How ``save_checkpoint``/``load_checkpoint`` write and read files (:class:`TorchCheckpointIO` by default).

        Raises:
            NotImplementedError: the strategy writes its own checkpoints (:attr:`accepts_checkpoint_io` is ``False``).
        """
        if not self.accepts_checkpoint_io:
            raise NotImplementedError(
                f"{type(self).__name__} does not use the `CheckpointIO` plugin interface: {self._own_checkpoints}."
            )
        if self._checkpoint_io is None:
            self._checkpoint_io = TorchCheckpointIO()
        return self._checkpoint_io

    @checkpoint_io.setter
    def checkpoint_io(self, io: CheckpointIO) -> None:
        if not self.accepts_checkpoint_io and isinstance(io, AsyncCheckpointIO):
            if self._saves_own_checkpoints_async and io.checkpoint_io is None:
                self._checkpoint_io = io
                return
            hint = (
                " Pass AsyncCheckpointIO() without a checkpoint_io: it switches the folders to DCP's async_save."
                if self._saves_own_checkpoints_async
                else " Save synchronously (remove AsyncCheckpointIO from Fabric(plugins=...)), or use strategy='ddp'."
            )
            raise NotImplementedError(
                f"{type(self).__name__} cannot save through {io!r}: {self._own_checkpoints}.{hint}"
            )
        if not self.accepts_checkpoint_io:
            raise NotImplementedError(
                f"{type(self).__name__} does not support setting a `CheckpointIO` plugin (got {io!r}):"
                f" {self._own_checkpoints}."
                " Remove it from Fabric(plugins=...), or use strategy='ddp' to save through it."
            )
        self._checkpoint_io = _check_checkpoint_io(io, type(self).__name__)

    @property
    def launcher(self) -> Launcher | None:
        """What starts this strategy's processes; ``None`` when it needs no extra process."""
        return self._launcher

    @property
    def start_method(self) -> str | None:
        """How ``fabric.launch()`` starts the other local processes; ``None`` when it starts none."""
        return None

    @classmethod
    def _check_choices(cls, *, label: str, accelerator: str, precision: str) -> None:
        """Refuse, before any process starts, an accelerator or precision this strategy cannot run; ``label`` is how
        the user named the strategy. Nothing by default."""

    @classmethod
    def _named_precision(cls, name: str) -> Precision | None:
        """The strategy's own plugin for ``Fabric(precision=name)``; ``None``: the generic one."""
        return None

    @classmethod
    def _create(cls, devices: list[torch.device], **kwargs: Any) -> Strategy:
        """The strategy a registry name stands for: ``cls(**kwargs)``; :meth:`_complete` fills in the devices."""
        return cls(**kwargs)

    def _complete(
        self, devices: list[torch.device], *, environment: ClusterEnvironment, num_nodes: int, start_method: str | None
    ) -> None:
        """Take from the plan what the strategy was not given: devices, environment, number of nodes and start method
        (which makes the launcher). Nothing by default."""

    @property
    def distributed_sampler_kwargs(self) -> dict[str, Any] | None:
        """``num_replicas`` and ``rank`` for a ``DistributedSampler`` where :attr:`is_parallel`; else ``None``."""
        return {"num_replicas": self.world_size, "rank": self.global_rank} if self.is_parallel else None

    def setup_environment(self) -> None:
        """Prepare this process: select its device (and, for parallel strategies, join the process group)."""
        if self._accelerator is not None:
            self._accelerator.setup_device(self.root_device)

    # ------------------------------------------------------------------ modules and optimizers
    def setup_module_and_optimizers(
        self, module: Module, optimizers: list[Optimizer], scheduler: Any = None
    ) -> tuple[Module, list[Optimizer], Any]:
        """Set up a module and its optimizers (by default one after the other); ``scheduler`` is returned as given
        unless the strategy needs its own."""
        return self.setup_module(module), [self.setup_optimizer(opt) for opt in optimizers], scheduler

    def setup_module(self, module: Module) -> Module:
        """Wrap the module if the strategy needs to (e.g. in ``DistributedDataParallel``)."""
        return module

    def setup_optimizer(self, optimizer: Optimizer) -> Optimizer:
        """Wrap the optimizer if the strategy needs to."""
        return optimizer

    def module_to_device(self, module: Module) -> None:
        """Move the module's parameters and buffers to :attr:`root_device`."""
        module.to(self.root_device)

    def compile_module(self, module: Module, compiler: _Compiler) -> Module:
        """Compile ``module``, just set up, again with the settings of the user's ``torch.compile``; return what
        the model's calls go through. By default ``torch.compile`` around the whole set-up module.

        Example::

            call = strategy.compile_module(strategy.setup_module(model), compiler)
        """
        return compiler.wrap(module)

    def batch_to_device(self, batch: Any, device: torch.device | None = None) -> Any:
        """Move every tensor in ``batch`` to ``device`` (default :attr:`root_device`)."""
        return move_data_to_device(batch, device or self.root_device)

    def tensor_init_context(self) -> AbstractContextManager[Any]:
        """New tensors are created on :attr:`root_device` with the precision's dtype."""
        stack = ExitStack()
        stack.enter_context(self.root_device)
        stack.enter_context(self.precision.tensor_init_context())
        return stack

    def module_init_context(self, empty_init: bool | None = None) -> AbstractContextManager[Any]:
        """A new module's parameters are created on :attr:`root_device` with the precision's dtype;
        ``empty_init=True`` skips their initialisation (for weights about to be loaded)."""
        stack = ExitStack()
        stack.enter_context(self.root_device)
        if empty_init:
            stack.enter_context(_EmptyInit())
        stack.enter_context(self.precision.module_init_context())
        return stack

    def backward(self, tensor: Tensor, module: Module | None, *args: Any, **kwargs: Any) -> None:
        """Back-propagate ``tensor`` through the precision's hooks."""
        precision = self.precision
        if precision._plain_backward:
            tensor.backward(*args, **kwargs)  # type: ignore[no-untyped-call]  # no-op hooks: skip them
            return
        with precision.backward_context():  # lets the module wrapper tell fabric.backward from loss.backward()
            precision.pre_backward(tensor, module)
            precision.backward(tensor, module, *args, **kwargs)
            precision.post_backward(tensor, module)

    def optimizer_step(self, optimizer: Optimizer, **kwargs: Any) -> Any:
        """Step ``optimizer`` through the precision (which may skip the step, e.g. on inf gradients)."""
        precision = self.precision
        if precision._plain_optimizer_step:
            return optimizer.step(**kwargs)
        return precision.optimizer_step(optimizer, **kwargs)

    def pipeline(self, module: Module) -> Any | None:
        """The pipeline that runs ``module`` (what :meth:`setup_module` returned): an object whose ``step(args,
        kwargs, target, loss_fn)`` runs forward and backward over micro-batches; ``None`` (here) where the module's
        forward runs the whole model."""
        return None

    def no_backward_sync(self, module: Module, enabled: bool = True) -> AbstractContextManager[Any]:
        """A context in which backward does not synchronise gradients (no-op without a ``_backward_sync_control``)."""
        control = self._backward_sync_control
        return nullcontext() if control is None else control.no_backward_sync(module, enabled)

    def clip_gradients_norm(
        self,
        module: Module,
        optimizer: Optimizer,
        max_norm: float,
        norm_type: float = 2.0,
        error_if_nonfinite: bool = True,
    ) -> Tensor:
        """Scale gradients so that their total ``norm_type``-norm is at most ``max_norm``; return the norm before.
        With a loss scaler they are unscaled first, and inf/NaN gradients do not raise (the scaler skips the step)."""
        precision = self.precision
        precision.unscale_gradients(optimizer)
        return torch.nn.utils.clip_grad_norm_(
            list(precision.main_params(optimizer)),
            max_norm=max_norm,
            norm_type=norm_type,
            error_if_nonfinite=error_if_nonfinite and not precision.skips_nonfinite_steps(),
        )

    def clip_gradients_value(self, module: Module, optimizer: Optimizer, clip_val: float) -> None:
        """Clamp every gradient element to ``[-clip_val, clip_val]``."""
        self.precision.unscale_gradients(optimizer)
        torch.nn.utils.clip_grad_value_(list(self.precision.main_params(optimizer)), clip_value=clip_val)

    # ------------------------------------------------------------------ collectives
    @abstractmethod
    def all_reduce(
        self, tensor: TReduce, group: Any | None = None, reduce_op: str | ReduceOp | None = "mean"
    ) -> TReduce:
        """Reduce a tensor, or every tensor in a collection, across processes (see ``Fabric.all_reduce``)."""

    @abstractmethod
    def all_gather(self, tensor: Any, group: Any | None = None, sync_grads: bool = False) -> Any:
        """Gather a tensor, or every tensor in a collection, from all processes (see ``Fabric.all_gather``)."""

    @abstractmethod
    def broadcast(self, obj: TBroadcast, src: int = 0) -> TBroadcast:
        """Send ``obj`` from rank ``src`` to every process (see ``Fabric.broadcast``)."""

    @abstractmethod
    def barrier(self, name: str | None = None) -> None:
        """Wait until every process has entered the barrier."""

    def reduce_boolean_decision(self, decision: bool, all: bool = True) -> bool:
        """``all`` (or ``any`` with ``all=False``) of every process's ``decision``; the same on every process."""
        return bool(decision)

    # ------------------------------------------------------------------ checkpoints
    def get_module_state_dict(self, module: Module) -> dict[str, Any]:
        """The module's state dict, without any wrapper prefix."""
        return self._unwrapped(module).state_dict()

    def load_module_state_dict(self, module: Module, state_dict: dict[str, Any], strict: bool = True) -> None:
        """Load a state dict without any wrapper prefix into the module, wrapped (:meth:`_unwrapped`) or not."""
        self._unwrapped(module).load_state_dict(state_dict, strict=strict)

    def _unwrapped(self, module: Module) -> Module:
        """``module`` without the wrapper :meth:`setup_module` put around it, so checkpoints hold plain keys."""
        return module

    def get_optimizer_state(self, optimizer: Optimizer) -> dict[str, Any]:
        """The optimizer's state dict."""
        return optimizer.state_dict()

    def save_checkpoint(
        self,
        path: _PATH,
        state: dict[str, Any],
        storage_options: Any | None = None,
        filter: dict[str, Callable[[str, Any], bool]] | None = None,
    ) -> None:
        """Save ``state`` to ``path``: modules and optimizers by state dict, stateful objects by ``state_dict()``,
        other values as they are, the precision's state under ``PRECISION_KEY``. Rank 0 writes through
        :attr:`checkpoint_io`; every process returns once the file is complete, and raises if the write failed."""
        message: str | None = None
        error: Exception | None = None
        try:
            checkpoint = to_state_dicts(
                state, filter or {}, self.get_module_state_dict, self.get_optimizer_state, self.precision.state_dict()
            )
            if self.is_global_zero:
                self.checkpoint_io.save_checkpoint(checkpoint=checkpoint, path=path, storage_options=storage_options)
        except Exception as err:
            error, message = err, f"{type(err).__name__}: {err}"
        self._raise_shared_outcome(error, message, "Rank 0 failed to save the checkpoint")

    def _share_save_outcome(self, message: str | None) -> str | None:
        """Rank 0's ``message`` (``None``, or its error) on every process; here ``message`` itself."""
        return message

    def _raise_shared_outcome(self, error: Exception | None, message: str | None, failure: str) -> None:
        """Raise this process's ``error``, if any; else, if rank 0's ``message`` says it failed, a
        :class:`CheckpointError` starting with ``failure``."""
        message = self._share_save_outcome(message)
        if error is not None:
            raise error
        if message is not None:
            raise CheckpointError(f"{failure}: {message}")

    def _async_io(self) -> AsyncCheckpointIO | None:
        """The :class:`AsyncCheckpointIO` this strategy saves through, if any."""
        # read directly: strategies that refuse a CheckpointIO raise on access to the property
        io = self._checkpoint_io
        return io if isinstance(io, AsyncCheckpointIO) else None

    def _wait_for_saves(self) -> None:
        """Wait for a checkpoint being written in the background, if any; every process must call it. No process
        returns before it is published, and a failed write raises :class:`CheckpointError` on every process."""
        io = self._async_io()
        if io is None:
            return
        error: CheckpointError | None = None
        message: str | None = None
        try:
            io.wait()
        except CheckpointError as err:
            error, message = err, str(err)
        self._raise_shared_outcome(error, message, "Rank 0's checkpoint was not saved")

    def _launcher_run_dir(self) -> str | None:
        """The run folder of the fabric_lite launcher that stops this rank when another fails; ``None`` if none does."""
        return None

    def _finish_saves_after_failure(self, timeout: float | None = None) -> None:
        """After a training error: wait up to ``timeout`` s for the write in flight and print, not raise, its error
        (the training error stays the one raised). No collective."""
        io = self._async_io()
        if io is None:
            return
        finished = io._join(0.0)
        if not finished:  # the launcher must not stop this process half-way through the write
            with announce_save(self._launcher_run_dir(), timeout):
                finished = io._join(timeout)
        if not finished:
            print(
                f"fabric_lite: the checkpoint being written in the background was not finished within {timeout:.0f} s"
                " of the failure; it is not published (the previous checkpoint stays).",
                file=sys.stderr,
                flush=True,
            )
            return
        error = io._take_error()
        if error is not None:
            print(f"fabric_lite: besides the error below, {error}", file=sys.stderr, flush=True)

    def load_checkpoint(
        self,
        path: _PATH,
        state: Module | Optimizer | dict[str, Any] | None = None,
        strict: bool = True,
        weights_only: bool | None = True,
    ) -> dict[str, Any]:
        """Restore ``state`` in place from ``path`` (read by :attr:`checkpoint_io`, or a local sharded folder) and
        return what was not restored; the precision's state is always restored, never returned.

        ``state`` ``None`` or empty returns the whole checkpoint; a module or optimizer loads its raw state dict; a
        dict restores its modules, optimizers and stateful objects in place, writes plain values back into it and
        returns the other entries. With ``strict=True`` a key of ``state`` the checkpoint lacks raises ``KeyError``.
        A save in the background is waited for first, on every rank.
        """
        self._wait_for_saves()
        if not _is_remote(path) and folders.is_sharded_checkpoint(path):  # a local DCP folder (checked without fsspec)
            return self._load_sharded_checkpoint(path, state, strict, weights_only)
        checkpoint = self.checkpoint_io.load_checkpoint(path, weights_only=weights_only)
        pop_precision(checkpoint, self.precision.load_state_dict)
        if not state:
            return checkpoint
        if isinstance(state, Module):
            self.load_module_state_dict(state, checkpoint, strict=strict)
            return {}
        if isinstance(state, Optimizer):
            state.load_state_dict(checkpoint)
            return {}
        restore_entries(state, checkpoint, path, strict, lambda m, v: self.load_module_state_dict(m, v, strict=strict))
        return checkpoint

    def _load_sharded_checkpoint(
        self,
        path: _PATH,
        state: Module | Optimizer | dict[str, Any] | None,
        strict: bool,
        weights_only: bool | None,
        modules: Iterable[Module] = (),
    ) -> dict[str, Any]:
        """Read a sharded folder or a full file, every rank its own shards, into ``modules`` set up by this strategy."""
        return sharded.load(
            path,
            state,
            strict,
            weights_only,
            load_precision=self.precision.load_state_dict,
            modules=modules,
            foreign_keys=self._foreign_keys,
        )

    def _foreign_keys(self, module: Module) -> set[str]:
        """The state-dict keys of the model that other ranks hold instead of ``module`` (none here: every rank holds
        a shard or a copy of every key)."""
        return set()

    def teardown(self) -> None:
        """Release what the strategy holds (process group, device caches)."""
        self.precision.teardown()
        if self._accelerator is not None:
            self._accelerator.teardown()
        if self._checkpoint_io is not None:  # read directly: strategies that refuse a CheckpointIO raise on access
            self._checkpoint_io.teardown()  # AsyncCheckpointIO: waits for its write, and raises if it failed

    def __repr__(self) -> str:
        return f"{type(self).__name__}(device={self.root_device})"


class _Sharded(Strategy):
    """What ``FSDPStrategy`` and ``ModelParallelStrategy`` share (Lightning's sharding interface): setting a module
    up replaces its parameters with shards, so optimizers are rebound by name; ``empty_init`` creates parameters on
    the meta device; a compiled model is compiled again unit by unit; checkpoints are DCP folders or gathered files
    written by the strategy (:attr:`state_dict_type`); the device mesh is built in ``setup_environment``.

    Example::

        class MyShardedStrategy(_Sharded, ParallelStrategy):
            state_dict_type = "sharded"
    """

    accepts_checkpoint_io = False
    _own_checkpoints = (
        "every rank writes its shards of a folder through torch.distributed.checkpoint, or rank 0 a gathered file"
    )
    _saves_own_checkpoints_async = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        #: the gloo group of the background saves, made at the first one (apart from training's collectives, which
        #: run meanwhile)
        self._checkpoint_group: Any | None = None
        self._background_tag, self._background_saves = "", 0
        #: the modules set up by this strategy, to find the module an optimizer belongs to
        self._modules: weakref.WeakSet[Module] = weakref.WeakSet()
        # nested no_backward_sync blocks switch FSDP2's gradient reduction back on when the outermost one ends
        self._backward_sync_control: _NestedSyncSwitch = _NestedSyncSwitch(self._sync_target, _set_gradient_sync)
        #: the mesh modules are sharded over, built by ``setup_environment`` once the processes have joined
        self._device_mesh: DeviceMesh | None = None

    def _sync_target(self, module: Module) -> Module:
        """``module`` itself, for ``no_backward_sync``; ``TypeError`` unless this strategy set it up."""
        if module not in self._modules:
            raise TypeError(
                f"Blocking backward sync is only possible for a module set up by {type(self).__name__}, got"
                f" {type(module).__name__}. Set the module up with fabric.setup_module(model) first."
            )
        return module

    @abstractmethod
    def _build_mesh(self) -> DeviceMesh:
        """The device mesh of this run's ranks (the process group exists)."""

    @override
    def setup_environment(self) -> None:
        super().setup_environment()
        self._device_mesh = self._build_mesh()

    @property
    @abstractmethod
    def state_dict_type(self) -> str:
        """What ``fabric.save`` writes: ``"sharded"`` (a folder, every rank its shards) or ``"full"`` (one file)."""

    def module_sharded_context(self) -> AbstractContextManager[Any]:
        """Lightning's context for creating a module sharded; a no-op here, as the module is sharded at setup."""
        return nullcontext()

    @override
    def setup_module_and_optimizers(
        self, module: Module, optimizers: list[Optimizer], scheduler: Any = None
    ) -> tuple[Module, list[Optimizer], Any]:
        """Set the module up, then point each optimizer at the new parameters by name, as if created after it.

        Raises:
            ValueError: an optimizer already holds state, or a parameter the module does not have under its name.
        """
        optimizers = [optimizers] if isinstance(optimizers, Optimizer) else list(optimizers)
        names = _fsdp_setup.optimizer_parameter_names(module, optimizers, type(self).__name__)
        set_up = self.setup_module(module)
        parameters = dict(self._parameters_after_setup(module, set_up).named_parameters())
        for optimizer in optimizers:
            _fsdp_setup.rebind_optimizer(optimizer, names, parameters)
            self._prepare_optimizer(optimizer)
        return set_up, optimizers, scheduler

    def _parameters_after_setup(self, module: Module, set_up: Module) -> Module:
        """The module whose parameters replace ``module``'s after setup: by default ``set_up`` itself."""
        return set_up

    @override
    def setup_optimizer(self, optimizer: Optimizer) -> Optimizer:
        """Check that ``optimizer`` updates the parameters of modules set up by this strategy; ``ValueError`` where
        it holds others (it was created before ``setup_module``)."""
        owned = {id(p) for module in self._modules for p in module.parameters()}
        params = [p for group in optimizer.param_groups for p in group["params"]]
        foreign = sum(1 for p in params if id(p) not in owned)
        if foreign:
            raise ValueError(
                f"The {type(optimizer).__name__} optimizer holds {foreign} of {len(params)} parameter(s) that are not"
                f" the parameters of a module set up with {type(self).__name__}: it was created before"
                " fabric.setup_module(model), which replaces the parameters. Create the optimizer after setting up"
                " the module: model = fabric.setup_module(model); optimizer ="
                " fabric.setup_optimizers(torch.optim.AdamW(model.parameters())), or pass both to"
                " fabric.setup(model, optimizer)."
            )
        self._prepare_optimizer(optimizer)
        return optimizer

    def _prepare_optimizer(self, optimizer: Optimizer) -> None:
        """What the strategy adjusts on an optimizer over its modules' parameters; nothing by default."""

    @override
    def module_to_device(self, module: Module) -> None:
        """Nothing: ``setup_module`` places each rank's shards (moving the whole model would defeat sharding)."""

    @override
    def module_init_context(self, empty_init: bool | None = None) -> AbstractContextManager[Any]:
        """New parameters go to the meta device with ``empty_init=True`` (``setup_module`` allocates the shards),
        else to the CPU; in the precision's dtype either way."""
        stack = ExitStack()
        if empty_init:
            stack.enter_context(torch.device("meta"))
        stack.enter_context(self.precision.module_init_context())
        return stack

    @override
    def compile_module(self, module: Module, compiler: _Compiler) -> Module:
        """Compile each ``fully_shard`` unit in place, so the all-gathers stay eager between compiled blocks and the
        state dict keys are unchanged. Returns ``module``."""
        from torch.distributed.fsdp import FSDPModule

        compiler.compile_units(module, [unit for unit in module.modules() if isinstance(unit, FSDPModule)])
        return module

    @override
    def save_checkpoint(
        self,
        path: _PATH,
        state: dict[str, Any],
        storage_options: Any | None = None,
        filter: dict[str, Callable[[str, Any], bool]] | None = None,
    ) -> None:
        """Save ``state`` as a sharded folder or, with ``state_dict_type="full"``, one file gathered on rank 0. Every
        rank must call it.

        The folder is written beside ``path`` and swapped in once complete, so ``path`` holds the previous checkpoint
        or the whole new one (on several nodes, on a shared filesystem). Every rank returns once it is complete and
        raises :class:`CheckpointError` if any rank failed; with ``AsyncCheckpointIO()`` once the state is copied,
        a failure raising at the next save or load. An fsspec URL's filesystem gets ``storage_options``.
        """
        sharded.check_storage_options(type(self).__name__, path, storage_options)
        full = self.state_dict_type == "full"
        io = self._async_io()
        sharded.save(
            path,
            state,
            filter or {},
            storage_options,
            full=full,
            ranks=(self.global_rank, self.world_size, self.broadcast),
            precision_state=self.precision.state_dict(),
            modules=self._modules,
            background=None if io is None else self._background(io, full),
            complete_groups=self._complete_groups,
        )

    def _complete_groups(self, module: Module, optimizer_state: dict[str, Any]) -> dict[str, Any]:
        """The optimizer state of ``module`` as the checkpoint stores it (as it is here: every rank's parameter
        groups name every parameter)."""
        return optimizer_state

    def _background(self, io: AsyncCheckpointIO, full: bool) -> sharded.Background:
        """How this save is written in the background: the background group (made at the first save, with rank 0's
        tag for the temporary folders' names) and a numbered tag."""
        if full:
            return sharded.Background(io, None)
        if self._checkpoint_group is None:
            import torch.distributed as dist

            group = dist.new_group(backend="gloo", timeout=self.timeout)  # type: ignore[attr-defined]
            tag = [folders.temp_tag()]
            dist.broadcast_object_list(tag, src=0, group=group)
            self._checkpoint_group, self._background_tag, self._background_saves = group, tag[0], 0
        self._background_saves += 1
        return sharded.Background(io, self._checkpoint_group, f"{self._background_tag}-{self._background_saves}")

    @override
    def load_checkpoint(
        self,
        path: _PATH,
        state: Module | Optimizer | dict[str, Any] | None = None,
        strict: bool = True,
        weights_only: bool | None = True,
    ) -> dict[str, Any]:
        """As :meth:`Strategy.load_checkpoint`, at any world size, from a sharded folder (read with
        ``weights_only=True``; module and optimizer entries only loaded, never returned) or a full file of any
        strategy. Every rank must call it.

        Raises:
            CheckpointError: ``path`` is a folder but no sharded checkpoint, or unreadable.
            FileNotFoundError: nothing exists at ``path``.
        """
        self._wait_for_saves()
        return self._load_sharded_checkpoint(path, state, strict, weights_only, modules=self._modules)

    @override
    def teardown(self) -> None:
        self._checkpoint_group = None  # destroyed with the process group
        self._device_mesh = None
        self._modules = weakref.WeakSet()
        self._backward_sync_control.clear()
        super().teardown()


def _set_gradient_sync(module: Module, enabled: bool) -> None:
    """Switch FSDP2's gradient reduction on or off for every ``fully_shard`` unit in ``module``."""
    from torch.distributed.fsdp import FSDPModule

    for unit in module.modules():
        if isinstance(unit, FSDPModule):
            unit.set_requires_gradient_sync(enabled, recurse=False)


_CHECKPOINT_IO_METHODS = ("save_checkpoint", "load_checkpoint", "remove_checkpoint")


def _check_checkpoint_io(io: CheckpointIO | None, owner: str) -> CheckpointIO | None:
    """``io`` if it is a ``CheckpointIO`` or has its three methods; a class, path or string raises ``TypeError``."""
    missing = [name for name in _CHECKPOINT_IO_METHODS if not callable(getattr(io, name, None))]
    if io is not None and not isinstance(io, CheckpointIO) and (isinstance(io, type) or missing):
        raise TypeError(
            f"{owner}(checkpoint_io={io!r}) got a {type(io).__name__}: expected an instance of"
            " fabric_lite.plugins.io.CheckpointIO (e.g. TorchCheckpointIO(), or a subclass of your own), or None."
        )
    return io


def _validate_keys_for_strict_loading(
    requested_keys: Iterable[str], checkpoint_keys: Iterable[str], strict: bool
) -> None:
    """With ``strict``, raise ``KeyError`` for the first requested key the checkpoint lacks (Lightning's helper,
    called by custom strategies' ``load_checkpoint``)."""
    present = set(checkpoint_keys)
    missing = [key for key in requested_keys if key not in present]
    if strict and missing:
        raise KeyError(
            f"The requested state contains a key {missing[0]!r} that does not exist in the loaded checkpoint (it has"
            f" {sorted(present)}). To load only the keys it has, set `strict=False`."
        )
