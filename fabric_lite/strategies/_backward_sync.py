"""How a strategy skips the gradient synchronisation of backward passes (``fabric.no_backward_sync``): Lightning
Fabric's ``_BackwardSyncControl`` interface, and a switch per target for nested blocks."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Generator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any

from torch.nn import Module


class _BackwardSyncControl(ABC):
    """Skips the gradient synchronisation of backward passes, e.g. to accumulate gradients (Lightning Fabric's
    interface): a strategy holds one as ``_backward_sync_control``, and :meth:`Strategy.no_backward_sync` goes
    through it.

    Example::

        class NoSync(_BackwardSyncControl):
            def no_backward_sync(self, module, enabled):
                return module.no_sync() if enabled else nullcontext()

        strategy._backward_sync_control = NoSync()
    """

    @abstractmethod
    def no_backward_sync(self, module: Module, enabled: bool) -> AbstractContextManager[Any]:
        """A context in which backward passes through ``module`` do not synchronise gradients (when ``enabled``);
        the first backward outside it synchronises what they accumulated."""


class _SyncBlocker(_BackwardSyncControl):
    """A control that runs ``block()`` (a context) where synchronisation is to be skipped, for a strategy whose
    synchronisation is not a module's (Horovod's optimizers), or ``None`` where there is none to skip
    (``DataParallel``, one process: the context does nothing and says nothing)."""

    def __init__(self, block: Callable[[], AbstractContextManager[Any]] | None) -> None:
        self._block = block

    def no_backward_sync(self, module: Module, enabled: bool) -> AbstractContextManager[Any]:
        return self._block() if enabled and self._block is not None else nullcontext()


class _NestedSyncSwitch(_BackwardSyncControl):
    """Gradient synchronisation switched off per target (a module, a DeepSpeed engine) for nested blocks:
    ``switch(target, False)`` when the outermost block for it starts, ``switch(target, True)`` when that block ends,
    whatever it raised. ``target_of(module)`` finds the target, or raises ``TypeError`` for a module the strategy
    did not set up.

    Example::

        control = _NestedSyncSwitch(lambda module: module, lambda m, on: m.set_requires_gradient_sync(on))
        with control.no_backward_sync(model, enabled=True), control.no_backward_sync(model, enabled=True):
            ...  # switched off once, on again when the outer block ends
    """

    def __init__(self, target_of: Callable[[Module], Any], switch: Callable[[Any, bool], None]) -> None:
        self._target_of = target_of
        self._switch = switch
        self._depths: dict[int, int] = {}  # open blocks per target

    def no_backward_sync(self, module: Module, enabled: bool) -> AbstractContextManager[Any]:
        if not enabled:
            return nullcontext()
        return self._switched_off(self._target_of(module))

    def is_off(self, target: Any) -> bool:
        """Whether a block for ``target`` is open (its synchronisation is off)."""
        return id(target) in self._depths

    def clear(self) -> None:
        """Forget every open block (at teardown)."""
        self._depths.clear()

    @contextmanager
    def _switched_off(self, target: Any) -> Generator[None, None, None]:
        key = id(target)
        depth = self._depths.get(key, 0)
        if depth == 0:
            self._switch(target, False)
        self._depths[key] = depth + 1
        try:
            yield
        finally:
            self._depths[key] -= 1
            if self._depths[key] == 0:
                del self._depths[key]
                self._switch(target, True)
