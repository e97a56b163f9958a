"""The strategy interface: how modules, optimizers, collectives and checkpoints behave across processes."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager, ExitStack, nullcontext
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor
from torch.nn import Module
from torch.optim import Optimizer

from fabric_lite.accelerators import Accelerator
from fabric_lite.plugins.io.checkpoint_io import CheckpointIO
from fabric_lite.plugins.io.torch_io import TorchCheckpointIO
from fabric_lite.plugins.precision import Precision
from fabric_lite.utilities.apply_func import move_data_to_device
from fabric_lite.utilities.init import _EmptyInit
from fabric_lite.utilities.types import _PATH, ReduceOp, TBroadcast, TReduce, _Stateful

if TYPE_CHECKING:
    from fabric_lite.strategies.launchers.launcher import Launcher

#: where ``save_checkpoint`` keeps the precision's state (a loss scaler's); ``load_checkpoint`` restores it
PRECISION_KEY = "fabric_lite:precision"


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

    #: whether the strategy runs one process per device (and needs ``fabric.launch()``)
    is_parallel: bool = False

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
        was given through ``checkpoint_io=`` or ``Fabric(plugins=[...])``)."""
        if self._checkpoint_io is None:
            self._checkpoint_io = TorchCheckpointIO()
        return self._checkpoint_io

    @checkpoint_io.setter
    def checkpoint_io(self, io: CheckpointIO) -> None:
        self._checkpoint_io = _check_checkpoint_io(io, type(self).__name__)

    @property
    def launcher(self) -> Launcher | None:
        """What starts this strategy's processes; ``None`` when it needs no extra process."""
        return self._launcher

    @property
    def distributed_sampler_kwargs(self) -> dict[str, Any] | None:
        """``num_replicas`` and ``rank`` for a ``DistributedSampler``; ``None`` when the data is not split."""
        return None

    def setup_environment(self) -> None:
        """Prepare this process: select its device (and, for parallel strategies, join the process group)."""
        if self._accelerator is not None:
            self._accelerator.setup_device(self.root_device)

    # ------------------------------------------------------------------ modules and optimizers
    def setup_module_and_optimizers(
        self, module: Module, optimizers: list[Optimizer]
    ) -> tuple[Module, list[Optimizer]]:
        """Set up a module and its optimizers together; by default one after the other."""
        return self.setup_module(module), [self.setup_optimizer(opt) for opt in optimizers]

    def setup_module(self, module: Module) -> Module:
        """Wrap the module if the strategy needs to (e.g. in ``DistributedDataParallel``)."""
        return module

    def setup_optimizer(self, optimizer: Optimizer) -> Optimizer:
        """Wrap the optimizer if the strategy needs to."""
        return optimizer

    def module_to_device(self, module: Module) -> None:
        """Move the module's parameters and buffers to :attr:`root_device`."""
        module.to(self.root_device)

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
        precision._in_fabric_backward += 1  # lets the module wrapper tell fabric.backward from loss.backward()
        try:
            precision.pre_backward(tensor, module)
            precision.backward(tensor, module, *args, **kwargs)
            precision.post_backward(tensor, module)
        finally:
            precision._in_fabric_backward -= 1

    def optimizer_step(self, optimizer: Optimizer, **kwargs: Any) -> Any:
        """Step ``optimizer`` through the precision (which may skip the step, e.g. on inf gradients)."""
        precision = self.precision
        if precision._plain_optimizer_step:
            return optimizer.step(**kwargs)
        return precision.optimizer_step(optimizer, **kwargs)

    def no_backward_sync(self, module: Module, enabled: bool = True) -> AbstractContextManager[Any]:
        """A context in which backward does not synchronise gradients. A no-op for strategies without sync."""
        return nullcontext()

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
        """The module's state dict, without any wrapper prefix."""
        return module.state_dict()

    def load_module_state_dict(self, module: Module, state_dict: dict[str, Any], strict: bool = True) -> None:
        """Load ``state_dict`` into the module (unwrapped)."""
        module.load_state_dict(state_dict, strict=strict)

    def get_optimizer_state(self, optimizer: Optimizer) -> dict[str, Any]:
        """The optimizer's state dict."""
        return optimizer.state_dict()

    def _convert_state(self, state: dict[str, Any], filter: dict[str, Callable[[str, Any], bool]]) -> dict[str, Any]:
        converted: dict[str, Any] = {}
        for key, obj in state.items():
            if isinstance(obj, Module):
                value = self.get_module_state_dict(obj)
            elif isinstance(obj, Optimizer):
                value = self.get_optimizer_state(obj)
            elif isinstance(obj, _Stateful) and not isinstance(obj, type):
                value = obj.state_dict()
            else:
                value = obj
            if key in filter and isinstance(value, dict):
                keep = filter[key]
                value = {k: v for k, v in value.items() if keep(k, v)}
            converted[key] = value
        return converted

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
        ``storage_options``."""
        checkpoint = self._convert_state(state, filter or {})
        precision_state = self.precision.state_dict()
        if precision_state:
            checkpoint.setdefault(PRECISION_KEY, precision_state)
        if self.is_global_zero:
            self.checkpoint_io.save_checkpoint(checkpoint=checkpoint, path=path, storage_options=storage_options)

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
        """
        if _is_local_sharded_folder(path):
            from fabric_lite.strategies import _fsdp_checkpoint

            return _fsdp_checkpoint.load(self, path, state, strict, weights_only)
        checkpoint = self.checkpoint_io.load_checkpoint(path, weights_only=weights_only)
        if isinstance(checkpoint, dict) and PRECISION_KEY in checkpoint:
            # the loss scaler's state (saved by save_checkpoint) goes back into the precision, not to the caller
            self.precision.load_state_dict(checkpoint.pop(PRECISION_KEY))
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

    def teardown(self) -> None:
        """Release what the strategy holds (process group, device caches)."""
        self.precision.teardown()
        if self._accelerator is not None:
            self._accelerator.teardown()
        if self._checkpoint_io is not None:  # read directly: strategies that refuse a CheckpointIO raise on access
            self._checkpoint_io.teardown()

    def __repr__(self) -> str:
        return f"{type(self).__name__}(device={self.root_device})"


def _is_local_sharded_folder(path: _PATH) -> bool:
    """Whether ``path`` is a local folder written by ``torch.distributed.checkpoint`` (checked without fsspec)."""
    from fabric_lite.utilities import _dcp
    from fabric_lite.utilities._fs import _is_remote

    return not _is_remote(path) and _dcp.is_sharded_checkpoint(path)


def _check_checkpoint_io(io: CheckpointIO | None, owner: str) -> CheckpointIO | None:
    if io is not None and not isinstance(io, CheckpointIO):
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


def _apply_filter(
    key: str, filter: dict[str, Callable[[str, Any], bool]], source_dict: object, target_dict: dict[str, Any]
) -> None:
    """Put ``source_dict`` into ``target_dict[key]``; where ``filter`` has a function for ``key`` (and the source is a
    dict), only the items it keeps, and nothing at all when it keeps none (Lightning Fabric's private helper for
    ``save_checkpoint(filter=...)``).

    Example::

        target = {}
        _apply_filter("model", {"model": lambda k, v: "weight" in k}, model.state_dict(), target)
    """
    if key in filter and isinstance(source_dict, dict):
        keep = filter[key]
        for name, value in source_dict.items():
            if keep(name, value):
                target_dict.setdefault(key, {})[name] = value
    else:
        target_dict[key] = source_dict


def restore_entries(
    state: dict[str, Any],
    checkpoint: dict[str, Any],
    path: Any,
    strict: bool,
    load_module: Callable[[Module, Any], Any],
) -> None:
    """Restore ``state``'s entries from ``checkpoint``, popping each one it restores: modules through
    ``load_module``, optimizers and stateful objects through ``load_state_dict``, plain values by replacement (in
    ``state``); what is left in ``checkpoint`` is the remainder. With ``strict``, an entry of ``state`` that the
    checkpoint lacks raises ``KeyError`` naming both sides."""
    missing = [key for key in state if key not in checkpoint]
    if strict and missing:
        raise KeyError(
            f"The checkpoint {str(path)!r} has no entry for {missing} (it has {sorted(checkpoint)})."
            " Load with strict=False to restore only the entries it has."
        )
    for key, obj in list(state.items()):
        if key not in checkpoint:
            continue
        value = checkpoint.pop(key)
        if isinstance(obj, Module):
            load_module(obj, value)
        elif isinstance(obj, (Optimizer, _Stateful)) and not isinstance(obj, type):
            obj.load_state_dict(value)
        else:
            state[key] = value
