"""The wrappers ``Fabric.setup*`` return around the user's module, optimizers and dataloaders: they forward
everything to the wrapped object and add only what the strategy or precision needs."""

from __future__ import annotations

import functools
import inspect
import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from types import MethodType
from typing import Any

import torch
from torch import nn
from torch.optim import Optimizer
from torch.utils.data import DataLoader, IterableDataset

from fabric_lite._compile import Compiler, clean_state_dict_keys, is_compiled, uncompiled, unwrap_compiled
from fabric_lite.plugins.precision import Precision
from fabric_lite.runtime import resume as _resume
from fabric_lite.runtime.resume import EpochStart
from fabric_lite.strategies.strategy import Strategy
from fabric_lite.utilities.apply_func import apply_to_collection, move_data_to_device
from fabric_lite.utilities.data import SeedPerSample, _set_sampler_epoch, sized_len
from fabric_lite.utilities.device_dtype_mixin import _DeviceDtypeModuleMixin
from fabric_lite.utilities.seed import _gather_per_rank, _rank_and_world_size

#: methods of a LightningModule that are routed through the strategy's forward without mark_forward_method
_LIGHTNING_MODULE_STEP_METHODS = ("training_step", "validation_step", "test_step", "predict_step")


class _FabricModule(_DeviceDtypeModuleMixin):
    """Wraps the module set up by ``Fabric.setup``: calling it runs the strategy's module (e.g. DDP, compiled
    again if the model was) under the precision's forward hooks. ``state_dict`` and other attributes are the
    original module's (``.module``), so checkpoint keys carry no wrapper prefix."""

    def __init__(self, forward_module: nn.Module, strategy: Strategy, original_module: nn.Module | None = None):
        super().__init__()
        if is_compiled(forward_module):
            clean_state_dict_keys(forward_module)
        self._forward_module = forward_module
        self._original_module = original_module if original_module is not None else forward_module
        self._strategy = strategy
        precision = strategy.precision
        # in __dict__ too, for the hot path: nn.Module keeps submodules in `_modules`, reached through __getattr__
        object.__setattr__(self, "_call", forward_module)
        # decided once, not per call: full precision's forward hooks do nothing (a duck-typed plugin's always run)
        plain = isinstance(precision, Precision) and not precision.changes_forward()
        object.__setattr__(self, "_precision", None if plain else precision)
        # a LightningModule's step methods run through the strategy's forward as in Lightning (for DDP's hooks)
        object.__setattr__(self, "_forward_methods", set(_LIGHTNING_MODULE_STEP_METHODS))
        object.__setattr__(self, "_fabric_module_initialized", True)

    @property
    def module(self) -> nn.Module:
        """The module passed to ``Fabric.setup``, uncompiled unless ``_reapply_compile=False``."""
        return self._original_module

    @property
    def _strategy_module(self) -> nn.Module:
        """The strategy's module (e.g. the ``DistributedDataParallel`` module), without a compiled wrapper."""
        return uncompiled(self._forward_module)  # type: ignore[no-any-return]

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        precision = self._precision
        if precision is None:
            return self._call(*args, **kwargs)
        args, kwargs = precision.convert_input((args, kwargs))
        with precision.forward_context():
            output = self._call(*args, **kwargs)
        output = precision.convert_output(output)
        if precision.requires_fabric_backward():
            apply_to_collection(output, torch.Tensor, _guard_backward, precision)
        return output

    def state_dict(self, *args: Any, **kwargs: Any) -> Any:
        return self._original_module.state_dict(*args, **kwargs)

    def load_state_dict(self, state_dict: Mapping[str, Any], strict: bool = True, **kwargs: Any) -> Any:  # type: ignore[override]
        return self._original_module.load_state_dict(state_dict, strict=strict, **kwargs)

    def mark_forward_method(self, method: MethodType | str) -> None:
        """Route calls of another method (e.g. ``generate``) through the strategy's forward, like ``forward``:
        ``DistributedDataParallel`` only synchronises what runs through its ``forward``.

        Args:
            method: the method's name, or the bound method itself (``model.generate``).

        Raises:
            TypeError: ``method`` is neither a string nor a bound method.
            ValueError: ``method`` is ``forward``.
            AttributeError: the original module has no method of that name.
        """
        if not isinstance(method, (MethodType, str)):
            raise TypeError(
                f"Expected a method or a string, but got: {type(method).__name__} ({method!r}). Pass the method's name,"
                " e.g. mark_forward_method('generate'), or the bound method: mark_forward_method(model.generate)."
            )
        name = method if isinstance(method, str) else method.__name__
        if name == "forward":
            raise ValueError(
                "You cannot mark the forward method itself as a forward method: it runs through the strategy already."
                " Mark other methods, e.g. 'generate'."
            )
        original = uncompiled(self._original_module)
        if not isinstance(getattr(original, name, None), MethodType):
            raise AttributeError(
                f"You marked {name!r} as a forward method, but `{type(original).__name__}.{name}` does not exist or"
                " is not a method."
            )
        self._forward_methods.add(name)

    def _redirect_through_forward(self, name: str) -> Callable[..., Any]:
        original = uncompiled(self._original_module)  # whose forward the strategy's module (or compiled one) calls

        def redirected(*args: Any, **kwargs: Any) -> Any:
            # undo the redirection before running the method, so that it can call the real forward itself; the
            # method is looked up only now, so a module without it raises when it is called, as it would directly
            original.__dict__.pop("forward", None)
            return getattr(original, name)(*args, **kwargs)

        def call_forward_module(*args: Any, **kwargs: Any) -> Any:
            # the strategy's wrapper calls ``original.forward``; point it at the marked method for this one call
            original.forward = redirected
            try:
                return self(*args, **kwargs)
            finally:
                original.__dict__.pop("forward", None)

        return call_forward_module

    def __getattr__(self, name: str) -> Any:
        forward_methods = self.__dict__.get("_forward_methods")
        # a marked method runs through whatever wraps the module: the strategy's wrapper, or the compiled forward
        if forward_methods and name in forward_methods and self.__dict__["_call"] is not self._original_module:
            return self._redirect_through_forward(name)
        try:
            return super().__getattr__(name)
        except AttributeError:
            original = super().__getattr__("_original_module")
            attribute = getattr(original, name)
            if inspect.ismethod(attribute) and self._strategy_module is not uncompiled(original):
                return self._guard_unmarked_method(attribute, name)
            return attribute

    def _guard_unmarked_method(self, method: Callable[..., Any], name: str) -> Callable[..., Any]:
        """``method`` (not marked with :meth:`mark_forward_method`), made to raise if a submodule runs inside it
        with gradients enabled: that would bypass the strategy's forward and quietly break gradient sync. Under
        ``torch.no_grad()`` it runs (Lightning raises either way)."""
        original = uncompiled(self._original_module)

        def refuse_with_gradients(module: nn.Module, _: Any) -> None:
            if torch.is_grad_enabled():
                raise RuntimeError(
                    f"You are calling the method `{type(original).__name__}.{name}()` from outside the model, and"
                    f" it runs the submodule {type(module).__name__} with gradients enabled: that bypasses the"
                    " strategy's forward (DDP would not synchronise those gradients correctly). Mark it as a forward"
                    f" method with `fabric_model.mark_forward_method({name!r})` after `fabric.setup()`, or call it"
                    " under `torch.no_grad()` if it does not train."
                )

        @functools.wraps(method)
        def guarded(*args: Any, **kwargs: Any) -> Any:
            handles = [module.register_forward_pre_hook(refuse_with_gradients) for module in original.modules()]
            try:
                return method(*args, **kwargs)
            finally:
                for handle in handles:
                    handle.remove()

        return guarded

    def __setattr__(self, name: str, value: Any) -> None:
        if not self.__dict__.get("_fabric_module_initialized", False):
            super().__setattr__(name, value)
            return
        original = self._original_module
        wrapper_has = name in dir(self)
        if hasattr(original, name) or not wrapper_has:
            setattr(original, name, value)
        if wrapper_has:
            super().__setattr__(name, value)


def _forwarded(name: str) -> Any:
    """A property that reads and writes the attribute ``name`` of the wrapped optimizer."""
    return property(
        lambda self: getattr(self.optimizer, name), lambda self, value: setattr(self.optimizer, name, value)
    )


class _FabricOptimizer(Optimizer):
    """Wraps an optimizer set up by ``Fabric.setup``: ``step`` goes through the strategy and its precision, the
    rest is the wrapped optimizer's (``.optimizer``). Its class is made for the wrapped one (e.g. ``FabricAdam``),
    so ``isinstance(fabric_opt, torch.optim.Adam)`` holds, as in Lightning, and schedulers accept it."""

    def __new__(cls, optimizer: Optimizer, strategy: Strategy, callbacks: list[Any] | None = None) -> _FabricOptimizer:
        if cls is _FabricOptimizer:
            cls = _wrapper_class(optimizer)
        return super().__new__(cls)

    def __init__(self, optimizer: Optimizer, strategy: Strategy, callbacks: list[Any] | None = None) -> None:
        # Optimizer.__init__ is deliberately not called: all state lives in the wrapped optimizer
        self.__dict__["_optimizer"] = optimizer
        self.__dict__["_strategy"] = strategy
        self.__dict__["_callbacks"] = callbacks or []
        # zero_grad needs nothing from the strategy: bind the optimizer's own, saving a call on every step
        self.__dict__["zero_grad"] = optimizer.zero_grad

    @property
    def optimizer(self) -> Optimizer:
        return self.__dict__["_optimizer"]  # type: ignore[no-any-return]

    param_groups = _forwarded("param_groups")
    state = _forwarded("state")
    defaults = _forwarded("defaults")

    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        state = self.__dict__
        strategy: Strategy = state["_strategy"]
        optimizer = state["_optimizer"]
        if closure is None:
            output = strategy.optimizer_step(optimizer)
        else:
            output = strategy.optimizer_step(optimizer, closure=closure)
        for callback in state["_callbacks"]:
            hook = getattr(callback, "on_after_optimizer_step", None)
            if callable(hook):
                hook(strategy=strategy, optimizer=optimizer)
        return output

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.optimizer.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict[str, Any]:
        return self.__dict__["_strategy"].get_optimizer_state(self.optimizer)  # type: ignore[no-any-return]

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state_dict)

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        self.optimizer.add_param_group(param_group)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return getattr(self.__dict__["_optimizer"], name)

    def __setattr__(self, name: str, value: Any) -> None:
        if name in ("param_groups", "state", "defaults"):
            object.__setattr__(self, name, value)  # the property setters forward it
        elif hasattr(_FabricOptimizer, name):
            # a method of the wrapper patched on this instance (an LR scheduler wraps ``step``): it must stay on the
            # wrapper, or the wrapped optimizer's step would call back into this one
            self.__dict__[name] = value
        else:
            setattr(self.optimizer, name, value)

    def __reduce__(self) -> tuple[Any, ...]:
        # the class made for this wrapper cannot be found by name: a copy is a wrapper made again, with this state
        state = self.__dict__
        return (_FabricOptimizer, (state["_optimizer"], state["_strategy"], state["_callbacks"]), self.__getstate__())

    def __getstate__(self) -> dict[str, Any]:
        return dict(self.__dict__)

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

    def __repr__(self) -> str:
        return f"Fabric{self.optimizer!r}"


def _wrapper_class(optimizer: Any) -> type[_FabricOptimizer]:
    """A subclass of :class:`_FabricOptimizer` and of ``optimizer.__class__``, or :class:`_FabricOptimizer` itself
    where that class is not an ``Optimizer`` or cannot be subclassed."""
    kind = optimizer.__class__
    if not (isinstance(kind, type) and issubclass(kind, Optimizer)) or issubclass(kind, _FabricOptimizer):
        return _FabricOptimizer
    namespace: dict[str, Any] = {"__module__": __name__}
    if hasattr(kind, "__del__"):
        # the wrapper owns nothing: a finaliser of the optimizer's class (DeepSpeedCPUAdam frees its C++ state) must
        # run when the optimizer goes, not when a wrapper around it does
        namespace["__del__"] = _owns_nothing
    try:
        return type(f"Fabric{kind.__name__}", (_FabricOptimizer, kind), namespace)
    except TypeError:  # a final class, or one whose layout or metaclass cannot be combined with the wrapper's
        return _FabricOptimizer


def _owns_nothing(self: Any) -> None:
    """The finaliser of a wrapper whose optimizer's class has one: nothing to free."""


class _FabricDataLoader:
    """Wraps a dataloader set up by ``Fabric.setup_dataloaders``: each iteration calls ``set_epoch(n)`` on its
    sampler and moves batches to ``device`` (if given); it counts the batches it hands out, so that a checkpoint
    taken inside an epoch resumes at the next batch (:meth:`state_dict`)."""

    def __init__(self, dataloader: DataLoader[Any], device: torch.device | None = None) -> None:
        if isinstance(dataloader.dataset, SeedPerSample) and dataloader.persistent_workers and dataloader.num_workers:
            raise ValueError(
                "A SeedPerSample dataset cannot run in persistent workers (persistent_workers=True): they keep the"
                " dataset of the first epoch, and with it its epoch, so every epoch would draw the same numbers. Pass"
                " persistent_workers=False to the DataLoader."
            )
        self._dataloader = dataloader
        self._device = device
        self._num_iter_calls = 0  # iterations (epochs) started
        # the index of the batch being processed, while an iteration is under way (for fabric.gather_for_metrics)
        self._batch_index: int | None = None
        self._yielded = 0  # batches handed out in the current epoch
        self._exhausted = True  # the current epoch ran to its end (or none has started)
        self._epoch_start: EpochStart | None = None
        self._pending: _PendingResume | None = None  # loaded by load_state_dict, used by the next iteration

    @property
    def device(self) -> torch.device | None:
        return self._device

    def __len__(self) -> int:
        return len(self._dataloader)

    def state_dict(self) -> Any:
        """The loader's position for a checkpoint: its own ``state_dict()`` if it has one (as in Lightning), else
        ``{"epoch": e, "batches_yielded": k, ...}`` with, inside an epoch, every rank's random state at the epoch's
        start (and an ``IterableDataset``'s state). It gathers from every process: every process must call it."""
        inner = getattr(self._dataloader, "state_dict", None)
        if callable(inner):
            return inner()
        epoch, skip, start = self._position()
        state: dict[str, Any] = {"epoch": epoch, "batches_yielded": skip, "fabric_lite_loader": _resume.FORMAT}
        state["num_batches"] = sized_len(self._dataloader)
        state["num_replicas"] = _rank_and_world_size()[1]
        mine = start.to_state() if skip and start is not None else None
        everyone = _gather_per_rank(mine)  # on every process, whatever each one's position
        if skip and mine is not None:
            state["rng_at_epoch_start"] = {"per_rank": everyone}
        dataset_state = _iterable_state(self._dataloader)
        if skip and dataset_state is not None:
            state["dataset"] = dataset_state()
        return state

    def _position(self) -> tuple[int, int, EpochStart | None]:
        """``(epoch, batches handed out in it, its start)``; between epochs the next epoch and 0."""
        if self._pending is not None:
            return self._pending.epoch, self._pending.skip, self._pending.start
        if self._exhausted or not self._yielded:
            return self._num_iter_calls, 0, None
        return self._num_iter_calls - 1, self._yielded, self._epoch_start

    def load_state_dict(self, state_dict: Any) -> None:
        """Restore what :meth:`state_dict` gave (a loader with its own ``load_state_dict`` gets the state): the next
        iteration continues the saved epoch at its next batch, without reading the batches before it. Where that
        cannot be exact (batches or processes changed, a stateless ``IterableDataset``) the epoch restarts, with a
        warning; a Lightning checkpoint, which holds no position, starts from the first epoch, with a warning."""
        inner = getattr(self._dataloader, "load_state_dict", None)
        if callable(inner):
            if isinstance(state_dict, Mapping) and set(state_dict) == {"epoch", "loader"}:
                self._num_iter_calls = int(state_dict["epoch"])
                state_dict = state_dict["loader"]
            inner(state_dict)
            return
        if not (isinstance(state_dict, Mapping) and "epoch" in state_dict):
            warnings.warn(
                f"The checkpoint holds a {type(state_dict).__name__} for this dataloader, not a loader state"
                " (Lightning Fabric saves a plain DataLoader object itself, without its position): the loader starts"
                " again from the first epoch. A checkpoint saved by fabric_lite records the position.",
                UserWarning,
                stacklevel=2,
            )
            return
        self._num_iter_calls = int(state_dict["epoch"])
        self._pending = None
        skip = int(state_dict.get("batches_yielded", 0))
        if skip:
            self._pending = self._resume_from(state_dict, skip)

    def _resume_from(self, state: Mapping[str, Any], skip: int) -> _PendingResume | None:
        epoch = int(state["epoch"])
        loader = self._dataloader
        if _iterable_state(loader) is not None and "dataset" in state:
            loader.dataset.load_state_dict(state["dataset"])  # type: ignore[attr-defined]
            return _PendingResume(epoch, skip, None, replay=False)
        rank, world_size = _rank_and_world_size()
        per_rank = state.get("rng_at_epoch_start", {}).get("per_rank", [])
        if not _resume.can_resume(loader):
            why = (
                "its IterableDataset has no state_dict/load_state_dict of its own, or runs in worker processes"
                " (use torchdata's StatefulDataLoader to resume inside an epoch)"
            )
        elif (state.get("num_batches"), state.get("num_replicas")) != (sized_len(loader), world_size):
            why = (
                f"it was saved with {state.get('num_batches')} batches on {state.get('num_replicas')} process(es),"
                f" and now has {sized_len(loader)} on {world_size}"
            )
        elif rank >= len(per_rank) or per_rank[rank] is None:
            why = f"the checkpoint holds no epoch-start random state for process {rank}"
        else:
            return _PendingResume(epoch, skip, EpochStart.from_state(per_rank[rank]), replay=True)
        warnings.warn(
            f"The checkpoint was saved after batch {skip} of epoch {epoch}, but the loader cannot continue from"
            f" there: {why}. The epoch restarts from its first batch.",
            UserWarning,
            stacklevel=3,
        )
        return None

    def __iter__(self) -> Iterator[Any]:
        loader = self._dataloader
        pending, self._pending = self._pending, None
        _set_sampler_epoch(loader, self._num_iter_calls)
        if isinstance(loader.dataset, SeedPerSample):
            loader.dataset.set_epoch(self._num_iter_calls)
        self._num_iter_calls += 1
        iteration = self._num_iter_calls
        source: Any = None
        first = 0
        if pending is not None:
            first = pending.skip
            self._epoch_start = pending.start
            if not pending.replay:
                source = loader  # the dataset positioned itself
            elif pending.start is not None:
                source = _resume.resume_iterator(loader, pending.start, pending.skip)
            if source is None:  # cannot replay: the epoch restarts
                first = 0
        if source is None:
            self._epoch_start = EpochStart.capture(loader) if _resume.can_resume(loader) else None
            source = loader
        self._yielded, self._exhausted = first, False
        device = self._device
        try:
            for batch in source:
                self._batch_index = self._yielded
                self._yielded += 1
                yield batch if device is None else move_data_to_device(batch, device)
            if self._num_iter_calls == iteration:
                self._exhausted = True
        finally:
            # an abandoned iteration finishes when it is garbage collected: it must not end a newer one
            if self._num_iter_calls == iteration:
                self._batch_index = None

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name in _LOADER_SLOTS:
            raise AttributeError(name)
        return getattr(self._dataloader, name)


#: the wrapper's own attributes, which are never looked up on the wrapped loader
_LOADER_SLOTS = frozenset(
    ("_dataloader", "_device", "_num_iter_calls", "_batch_index", "_yielded", "_exhausted", "_epoch_start", "_pending")
)


@dataclass
class _PendingResume:
    """A position loaded by ``_FabricDataLoader.load_state_dict``, for its next iteration."""

    epoch: int
    skip: int
    start: EpochStart | None
    replay: bool  # False: the dataset positioned itself (an IterableDataset with a state_dict)


def _iterable_state(loader: Any) -> Any:
    """The ``state_dict`` method of the loader's ``IterableDataset``, or ``None`` where there is none or the
    dataset runs in workers (whose copies are out of reach)."""
    dataset = getattr(loader, "dataset", None)
    if not isinstance(dataset, IterableDataset) or getattr(loader, "num_workers", 0) > 0:
        return None
    method = getattr(dataset, "state_dict", None)
    return method if callable(method) and callable(getattr(dataset, "load_state_dict", None)) else None


def _guard_backward(tensor: torch.Tensor, precision: Precision) -> torch.Tensor:
    """Make ``loss.backward()`` through ``tensor`` raise where the precision needs ``fabric.backward(loss)`` (a
    loss scaler): the gradients would otherwise be silently wrong."""
    if not tensor.requires_grad:
        return tensor

    def check(grad: torch.Tensor) -> None:
        if not precision._in_fabric_backward:
            raise RuntimeError(
                f"precision={precision.precision!r} requires you to call `fabric.backward(loss)` instead of"
                " `loss.backward()`: the loss must be scaled before its backward."
            )

    tensor.register_hook(check)  # type: ignore[no-untyped-call]
    return tensor


def _unwrap_objects(collection: Any) -> Any:
    """``collection`` with every object ``Fabric.setup*`` returned (also compiled, also nested) replaced by what it
    wraps: the strategy's module (uncompiled), the optimizer, the dataloader."""
    return apply_to_collection(collection, (nn.Module, Optimizer, _FabricDataLoader), _unwrapped)


def _unwrap_state(state: dict[str, Any]) -> dict[str, Any]:
    """``state``'s entries unwrapped as by :func:`_unwrap_objects`, for ``Fabric.save``/``load``; dataloaders stay
    wrapped (their ``state_dict`` holds the position) and nested collections are left alone (loaded in place)."""
    return {key: _unwrapped(value, keep_loaders=True) for key, value in state.items()}


def _unwrapped(obj: Any, keep_loaders: bool = False) -> Any:
    obj = uncompiled(obj)  # torch.compile(model) or torch.compile(fabric_model): what it wraps
    if isinstance(obj, _FabricModule):
        return obj._strategy_module
    if isinstance(obj, _FabricOptimizer):
        return obj.optimizer
    if isinstance(obj, _FabricDataLoader) and not keep_loaders:
        return obj._dataloader
    return obj


def _unwrap_compiled(obj: Any) -> tuple[Any, Compiler | None]:
    """``obj`` without ``torch.compile``'s wrapper and a :class:`~fabric_lite._compile.Compiler` to compile it again
    (``None`` if not compiled), as Lightning's function of this name."""
    return unwrap_compiled(obj)


def is_wrapped(obj: object) -> bool:
    """Whether ``obj`` is a module, optimizer or dataloader returned by ``Fabric.setup*`` (also once compiled).

    Example::

        is_wrapped(fabric.setup(model))  # True
    """
    obj = uncompiled(obj)
    return isinstance(obj, (_FabricModule, _FabricOptimizer, _FabricDataLoader))
