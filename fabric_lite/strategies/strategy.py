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
    """What :meth:`Strategy.compile_module` asks of the settings of a ``torch.compile`` call to apply again
    (``fabric_lite._compile.Compiler`` is one): compile a module whole, or some of its submodules in place."""

    def wrap(self, module: Module) -> Module: ...

    def compile_units(self, root: Module, units: Iterable[Module]) -> None: ...


_F = TypeVar("_F", bound=Callable[..., Any])


def _takes_collections(method: _F) -> _F:
    """Mark a strategy's ``all_reduce``/``all_gather`` as one that takes a whole collection of tensors at once (one
    collective per dtype), which ``Fabric`` then passes the collection's tensors to in one call. A method without the
    mark (a strategy of your own that overrides it, written for Lightning's single-tensor contract) is called once
    per tensor, as Lightning's Fabric calls it."""
    method.__dict__["_takes_collections"] = True
    return method


class Strategy(ABC):
    """Base class of every strategy.

    A strategy owns the device placement of the module, the backward and optimizer step (through its precision),
    the collectives and checkpointing. Subclasses override what differs; every override keeps the contract of the
    method it overrides or raises ``NotImplementedError`` saying why.

    Args:
        accelerator: the kind of device. Filled in by ``Fabric`` when not given.
        checkpoint_io: how checkpoint files are written and read (default :class:`TorchCheckpointIO`).
        precision: the precision plugin. Filled in by ``Fabric`` when not given.

    Example::

        fabric = Fabric(accelerator="cpu", devices=2, strategy=DDPStrategy(timeout=timedelta(minutes=5)))
        fabric.strategy.world_size  # 2: every strategy answers the same questions, whatever it runs on

        class TracedDevice(SingleDeviceStrategy):  # a strategy of your own overrides only what differs
            def barrier(self, name=None):
                print(f"barrier {name}")
    """

    # What the plan (``fabric_lite/_plan.py``) and the build step ask of a strategy, for a class named in the registry
    # and for an instance alike: they never name a strategy class.
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
        """How ``save_checkpoint``/``load_checkpoint`` write and read files (a :class:`TorchCheckpointIO` unless one
        was given through ``checkpoint_io=`` or ``Fabric(plugins=[...])``).

        Raises:
            NotImplementedError: the strategy writes its checkpoints itself (:attr:`accepts_checkpoint_io` is
                ``False``), as Lightning Fabric's FSDP, model-parallel and DeepSpeed strategies do.
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
        """How ``fabric.launch()`` starts the other local processes (``"popen"``, ``"spawn"``, ``"fork"``); ``None``
        when it starts none."""
        return None

    @classmethod
    def _check_choices(cls, *, label: str, accelerator: str, precision: str) -> None:
        """Refuse, in ``Fabric(...)`` before any process starts, an accelerator or a precision this strategy cannot
        run; ``label`` is how the user named the strategy. Nothing by default."""

    @classmethod
    def _named_precision(cls, name: str) -> Precision | None:
        """The precision plugin ``Fabric(precision=name)`` makes for this strategy where it runs a plugin of its own
        kind (FSDP's ``FSDPPrecision``, as in Lightning); ``None``: the generic plugin of that name."""
        return None

    @classmethod
    def _create(cls, devices: list[torch.device], **kwargs: Any) -> Strategy:
        """The strategy a registry name stands for, on the devices the plan chose: ``cls(**kwargs)``, the devices
        filled in by :meth:`_complete`."""
        return cls(**kwargs)

    def _complete(
        self, devices: list[torch.device], *, environment: ClusterEnvironment, num_nodes: int, start_method: str | None
    ) -> None:
        """Take what ``Fabric``'s plan decided and the strategy was not given: the devices, the cluster environment,
        the number of nodes and how the extra processes start (which makes the launcher). Nothing by default: one
        device, chosen at construction."""

    @property
    def distributed_sampler_kwargs(self) -> dict[str, Any] | None:
        """``num_replicas`` and ``rank`` for a ``DistributedSampler``: one replica per process where the strategy
        :attr:`is_parallel`; ``None`` where the data is not split (one process sees every batch)."""
        return {"num_replicas": self.world_size, "rank": self.global_rank} if self.is_parallel else None

    def setup_environment(self) -> None:
        """Prepare this process: select its device (and, for parallel strategies, join the process group)."""
        if self._accelerator is not None:
            self._accelerator.setup_device(self.root_device)

    # ------------------------------------------------------------------ modules and optimizers
    def setup_module_and_optimizers(
        self, module: Module, optimizers: list[Optimizer], scheduler: Any = None
    ) -> tuple[Module, list[Optimizer], Any]:
        """Set up a module and its optimizers together (by default one after the other), and the learning-rate
        ``scheduler`` of ``fabric.setup(..., scheduler=...)``, if any, which is returned as it is unless the
        strategy needs its own (Lightning's contract: the three, in the order given)."""
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
        """Compile ``module``, just set up by this strategy, again with ``compiler``'s settings (those of the
        ``torch.compile`` the user applied before ``fabric.setup``); returns what calls of the model go through.
        By default ``torch.compile`` around the whole set-up module (DDP's hooks then run inside the graph).

        Example::

            model, compiler = unwrap_compiled(torch.compile(net))
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
        """A new module's parameters are created on :attr:`root_device` with the precision's dtype.

        With ``empty_init=True`` parameter initialisation is skipped (the memory is left uninitialised), for
        models whose weights are about to be loaded from a checkpoint.
        """
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

    def no_backward_sync(self, module: Module, enabled: bool = True) -> AbstractContextManager[Any]:
        """A context in which backward does not synchronise gradients, through :attr:`_backward_sync_control`. A
        no-op for strategies without one."""
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

        With a loss scaler the gradients are unscaled first (once per step), and inf/NaN gradients do not raise:
        they are the scaler's to handle, by skipping the step.
        """
        precision = self.precision
        precision.unscale_gradients(optimizer)
        parameters = list(precision.main_params(optimizer))
        return torch.nn.utils.clip_grad_norm_(
            parameters,
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
        """The module's state dict, without any wrapper prefix.

        Example::

            DataParallelStrategy().get_module_state_dict(DataParallel(nn.Linear(2, 1)))  # keys: weight, bias
        """
        return self._unwrapped(module).state_dict()

    def load_module_state_dict(self, module: Module, state_dict: dict[str, Any], strict: bool = True) -> None:
        """Load a state dict without any wrapper prefix into the module, wrapped (:meth:`_unwrapped`) or not."""
        self._unwrapped(module).load_state_dict(state_dict, strict=strict)

    def _unwrapped(self, module: Module) -> Module:
        """``module`` without the wrapper that :meth:`setup_module` put around it (``DataParallel``,
        ``DistributedDataParallel``), so that checkpoints hold the plain module's keys; here, ``module`` itself."""
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
        other values as they are. The precision's own state (a loss scaler's) is saved with them, under
        ``PRECISION_KEY``. Global rank 0 writes, through :attr:`checkpoint_io` (atomically by default), passing it
        ``storage_options``; then every process learns the outcome (:meth:`_share_save_outcome`), so a failed write
        raises everywhere and no process returns before the file is complete."""
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
        """Rank 0's outcome of :meth:`save_checkpoint` (``None``, or the error it raised), on every process: a
        broadcast from rank 0 in a strategy of several processes; ``message`` itself in one process."""
        return message

    def _raise_shared_outcome(self, error: Exception | None, message: str | None, failure: str) -> None:
        """Raise this process's own ``error``, if any; else, where rank 0's ``message`` (shared with every process by
        :meth:`_share_save_outcome`) says that it failed, a :class:`CheckpointError` starting with ``failure``."""
        message = self._share_save_outcome(message)
        if error is not None:
            raise error
        if message is not None:
            raise CheckpointError(f"{failure}: {message}")

    def _async_io(self) -> AsyncCheckpointIO | None:
        """The :class:`AsyncCheckpointIO` this strategy saves through, if any (read directly: strategies that refuse
        a ``CheckpointIO`` raise on access to :attr:`checkpoint_io`)."""
        io = self._checkpoint_io
        return io if isinstance(io, AsyncCheckpointIO) else None

    def _wait_for_saves(self) -> None:
        """Wait for a checkpoint being written in the background, if any; every process must call it (where the
        strategy saves through :class:`AsyncCheckpointIO`: the same on every process).

        Rank 0's outcome reaches every process (:meth:`_share_save_outcome`), so no process goes on (reads the
        checkpoint) before it is published, and a failed write raises :class:`CheckpointError` on every process.
        """
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

    def _finish_saves_after_failure(self, timeout: float | None = None) -> None:
        """After an error in training: wait up to ``timeout`` seconds for the write in flight, and print its error
        instead of raising it (the training error stays the one raised). No collective."""
        io = self._async_io()
        if io is None:
            return
        if not io._join(timeout):
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
        """Restore ``state`` in place from ``path`` and return what was not restored.

        The file is read by :attr:`checkpoint_io`. The precision's saved state (a loss scaler's) is always restored
        into the precision and never returned.

        * ``state`` is ``None`` or empty: the whole checkpoint is returned.
        * ``state`` is a module or optimizer: the file holds its raw state dict.
        * ``state`` is a dict: modules, optimizers and stateful objects are restored in place, plain values are
          written back into ``state``, and the checkpoint's other entries are returned. With ``strict=True`` a key
          of ``state`` that the checkpoint lacks raises ``KeyError`` naming every missing key.

        A local sharded checkpoint folder (``torch.distributed.checkpoint``, as the FSDP and model-parallel
        strategies write by default) is read too, into plain modules and optimizers, by every rank.

        A checkpoint being written in the background (:class:`AsyncCheckpointIO`) is waited for first, on every rank.
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
        """Read a sharded folder or a full file with the state dict API, every rank its own shards; ``modules`` are
        those a sharding strategy set up (none for the others)."""
        return sharded.load(
            path, state, strict, weights_only, load_precision=self.precision.load_state_dict, modules=modules
        )

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
    """What the strategies that shard a module when they set it up (``FSDPStrategy``, ``ModelParallelStrategy``) do
    the same way, under the name of Lightning Fabric's interface of sharding strategies
    (:meth:`module_sharded_context`).

    * Setting a module up replaces its parameters (sharded tensors): an optimizer created before, set up together
      with the module, is pointed at the new parameters by name; an optimizer set up alone must update the
      parameters of a module set up here.
    * ``init_module(empty_init=True)`` creates the parameters on the meta device; setting up allocates and
      initialises each rank's shards, so nothing is moved to the device before.
    * A compiled model is compiled again one ``fully_shard`` unit at a time.
    * Checkpoints are ``torch.distributed.checkpoint`` folders or gathered files, written by the strategy (no
      ``CheckpointIO``); :attr:`state_dict_type` says which.
    * ``setup_environment`` builds the device mesh (:meth:`_build_mesh`) once the processes have joined;
      ``teardown`` drops it.

    Example::

        class MyShardedStrategy(_Sharded, ParallelStrategy):
            state_dict_type = "sharded"

            def _build_mesh(self):
                return init_device_mesh(self.root_device.type, (self.world_size,))

            def setup_module(self, module):
                module = my_shard(module, self._device_mesh)
                self._modules.add(module)  # so that optimizers and checkpoints find it
                return module
    """

    accepts_checkpoint_io = False
    _own_checkpoints = (
        "every rank writes its shards of a folder through torch.distributed.checkpoint, or rank 0 a gathered file"
    )
    _saves_own_checkpoints_async = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        #: the gloo process group of the saves written in the background, made at the first one (never used by
        #: training collectives: the background's collectives run while training goes on)
        self._checkpoint_group: Any | None = None
        self._background_tag, self._background_saves = "", 0
        #: the modules set up by this strategy, to find the module an optimizer belongs to
        self._modules: weakref.WeakSet[Module] = weakref.WeakSet()
        # no_backward_sync skips FSDP2's gradient reduction (its reduce-scatter, and HSDP's all-reduce); nested
        # blocks switch it back on when the outermost one ends
        self._backward_sync_control: _NestedSyncSwitch = _NestedSyncSwitch(self._sync_target, _set_gradient_sync)
        #: the mesh modules are sharded over, built by ``setup_environment`` once the processes have joined
        self._device_mesh: DeviceMesh | None = None

    def _sync_target(self, module: Module) -> Module:
        """``module`` itself, for ``no_backward_sync``, if this strategy set it up.

        Raises:
            TypeError: it did not.
        """
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
        """A context for creating a module whose parameters are sharded as they are created (Lightning's
        interface): nothing here, the module is sharded when it is set up.

        Example::

            with strategy.module_sharded_context():
                model = GPT(config)
        """
        return nullcontext()

    @override
    def setup_module_and_optimizers(
        self, module: Module, optimizers: list[Optimizer], scheduler: Any = None
    ) -> tuple[Module, list[Optimizer], Any]:
        """Set the module up, then point each optimizer at the parameters that replaced the ones it was created
        with, by name (``fabric.setup(model, optimizer)``, as Lightning's users call it). An optimizer without state
        only holds references to its parameters, so it is then the optimizer it would have been if it had been
        created after :meth:`setup_module`.

        Raises:
            ValueError: an optimizer already holds state (it has stepped: the state belongs to the replaced
                tensors), or holds a parameter that is not one of the module's, or one the set-up module no longer
                has under its name.
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
        """The module whose parameters replace those of ``module``, which :meth:`setup_module` turned into
        ``set_up``: by default ``set_up`` itself."""
        return set_up

    @override
    def setup_optimizer(self, optimizer: Optimizer) -> Optimizer:
        """Check that ``optimizer`` updates the parameters of modules set up by this strategy.

        Raises:
            ValueError: it holds other tensors, typically because it was created before ``setup_module``.
        """
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
        """Nothing: ``setup_module`` places each rank's shards (moving the whole model first would need the memory
        that sharding saves, and a meta-device model cannot be moved)."""

    @override
    def module_init_context(self, empty_init: bool | None = None) -> AbstractContextManager[Any]:
        """With ``empty_init=True`` a new module's parameters are created on the meta device (no memory, no
        initialisation; ``setup_module`` allocates and initialises each rank's shards). Otherwise on the CPU, from
        where ``setup_module`` moves each rank's shards to the device. In the precision's dtype either way."""
        stack = ExitStack()
        if empty_init:
            stack.enter_context(torch.device("meta"))
        stack.enter_context(self.precision.module_init_context())
        return stack

    @override
    def compile_module(self, module: Module, compiler: _Compiler) -> Module:
        """Compile each ``fully_shard`` unit of ``module`` below the root in place (block by block, as torchtitan
        does; the root only when it is the one unit), so the parameter all-gathers stay eager between compiled
        blocks and state dict keys are unchanged. Returns ``module``.

        Example::

            model = strategy.compile_module(strategy.setup_module(model), compiler)  # blocks compiled one by one
        """
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
        """Save ``state`` as a sharded folder or, with ``state_dict_type="full"``, one file gathered on rank 0 (its
        optimizer state keyed by parameter name). Every rank must call it.

        The folder is written beside ``path`` and swapped into place once complete, so ``path`` always holds either
        the previous checkpoint or the whole new one; a previous checkpoint there is replaced, any other folder
        refused. On several nodes ``path`` must be on a shared filesystem. Every rank returns once the checkpoint is
        complete, and raises :class:`CheckpointError` if any rank failed; with ``AsyncCheckpointIO()`` ranks return
        once the state is copied, and a failure raises at the next save or load. ``path`` may be an fsspec URL,
        whose filesystem gets ``storage_options`` (a local path takes none).

        Example::

            fabric.save("checkpoints/step-100", {"model": model, "optimizer": optimizer, "step": 100})
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
        )

    def _background(self, io: AsyncCheckpointIO, full: bool) -> sharded.Background:
        """How this save is written in the background: the process group of the background saves, made at the first
        one by every rank, with rank 0's tag for the temporary folders' names (agreed on then, once), numbered."""
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
    def _finish_saves_after_failure(self, timeout: float | None = None) -> None:
        # the background's collectives fail on their own within the timeout once a peer is gone
        super()._finish_saves_after_failure(self.timeout.total_seconds())  # type: ignore[attr-defined]

    @override
    def load_checkpoint(
        self,
        path: _PATH,
        state: Module | Optimizer | dict[str, Any] | None = None,
        strict: bool = True,
        weights_only: bool | None = True,
    ) -> dict[str, Any]:
        """Restore ``state`` in place from a sharded folder or a full file, at any world size, and return what was not
        restored. Every rank must call it.

        As for :meth:`Strategy.load_checkpoint`, except that a sharded folder's module and optimizer entries are only
        loaded into modules and optimizers, never returned (``state=None`` returns everything). A full file may come
        from any strategy. Sharded folders are always read with ``weights_only=True``.

        Raises:
            CheckpointError: ``path`` is a folder but no sharded checkpoint, one file of a sharded checkpoint, or
                unreadable; the message names the path.
            FileNotFoundError: nothing exists at ``path``.

        Example::

            remainder = fabric.load("checkpoints/step-100", {"model": model, "optimizer": optimizer})
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
    """Switch FSDP2's gradient reduction (reduce-scatter, and HSDP's all-reduce) on or off for every ``fully_shard``
    unit in ``module``; a module without units has nothing to switch."""
    from torch.distributed.fsdp import FSDPModule

    for unit in module.modules():
        if isinstance(unit, FSDPModule):
            unit.set_requires_gradient_sync(enabled, recurse=False)


_CHECKPOINT_IO_METHODS = ("save_checkpoint", "load_checkpoint", "remove_checkpoint")


def _check_checkpoint_io(io: CheckpointIO | None, owner: str) -> CheckpointIO | None:
    """``io`` if it can save, load and remove checkpoints: a ``CheckpointIO``, or any object with those three methods
    (Lightning accepts any object; a class, a path or a string is a mistake worth naming here)."""
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
    """With ``strict``, raise ``KeyError`` for the first requested key the checkpoint lacks (Lightning Fabric's
    private helper, which custom strategies' ``load_checkpoint`` call).

    Example::

        _validate_keys_for_strict_loading(state.keys(), checkpoint.keys(), strict=True)
    """
    present = set(checkpoint_keys)
    missing = [key for key in requested_keys if key not in present]
    if strict and missing:
        raise KeyError(
            f"The requested state contains a key {missing[0]!r} that does not exist in the loaded checkpoint (it has"
            f" {sorted(present)}). To load only the keys it has, set `strict=False`."
        )
