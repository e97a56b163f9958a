"""How a strategy skips backward's gradient synchronisation (``fabric.no_backward_sync``)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Generator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any

from torch.nn import Module


class _BackwardSyncControl(ABC):
    """Lightning's interface that :meth:`Strategy.no_backward_sync` goes through (``_backward_sync_control``)."""

    @abstractmethod
    def no_backward_sync(self, module: Module, enabled: bool) -> AbstractContextManager[Any]:
        """A context in which backward through ``module`` does not synchronise gradients (when ``enabled``)."""


class _SyncBlocker(_BackwardSyncControl):
    """A control that enters ``block()`` to skip synchronisation (Horovod's); ``None``: nothing to skip."""

    def __init__(self, block: Callable[[], AbstractContextManager[Any]] | None) -> None:
        self._block = block

    def no_backward_sync(self, module: Module, enabled: bool) -> AbstractContextManager[Any]:
        return self._block() if enabled and self._block is not None else nullcontext()


class _NestedSyncSwitch(_BackwardSyncControl):
    """Gradient synchronisation switched off per target (a module, a DeepSpeed engine) for nested blocks:
    ``switch(target, False)`` when the outermost block starts, ``switch(target, True)`` when it ends, whatever it
    raised. ``target_of(module)`` finds the target, or raises ``TypeError`` for a module not set up here."""

    def __init__(self, target_of: Callable[[Module], Any], switch: Callable[[Any, bool], None]) -> None:
        self._target_of = target_of
        self._switch = switch
        self._depths: dict[int, int] = {}  # open blocks per target

    def no_backward_sync(self, module: Module, enabled: bool) -> AbstractContextManager[Any]:
        return self._switched_off(self._target_of(module)) if enabled else nullcontext()

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
