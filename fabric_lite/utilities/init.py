"""Creating modules without initialising them, and initialising meta-device modules (Lightning Fabric's private
``utilities.init`` names)."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.nn import Module, Parameter
from torch.optim import Optimizer
from torch.overrides import TorchFunctionMode

from fabric_lite.utilities.rank_zero import rank_zero_warn
from fabric_lite.utilities.types import _DEVICE


class _EmptyInit(TorchFunctionMode):
    """Skip parameter initialisation: every ``torch.nn.init`` function returns its tensor untouched, for weights about
    to be loaded. A torch-function mode, so nothing global is patched; ``enabled=False`` makes it a no-op."""

    def __init__(self, enabled: bool = True) -> None:
        super().__init__()
        self.enabled = enabled

    def __torch_function__(
        self,
        func: Callable[..., Any],
        types: Sequence[type],
        args: Sequence[Any] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        if self.enabled and getattr(func, "__module__", None) == "torch.nn.init":
            return kwargs["tensor"] if "tensor" in kwargs else args[0]
        return func(*args, **kwargs)


def _has_meta_device_parameters_or_buffers(obj: Module | Optimizer, recurse: bool = True) -> bool:
    """Whether a module has a meta-device parameter or buffer (an optimizer: a meta parameter).

    Raises:
        TypeError: ``obj`` is neither a module nor an optimizer.
    """
    if isinstance(obj, Optimizer):
        return any(p.is_meta for group in obj.param_groups for p in group["params"] if isinstance(p, Parameter))
    if isinstance(obj, Module):
        return any(t.is_meta for t in itertools.chain(obj.parameters(recurse=recurse), obj.buffers(recurse=recurse)))
    raise TypeError(f"Expected `torch.nn.Module` or `torch.optim.Optimizer`, got {type(obj).__name__}: {obj!r}")


def _materialize(module: Module, device: _DEVICE) -> None:
    """Allocate ``module``'s own parameters and buffers on ``device`` and initialise them with ``reset_parameters()``.

    Raises:
        TypeError: the module has no ``reset_parameters``.
    """
    module.to_empty(device=device, recurse=False)
    reset = getattr(module, "reset_parameters", None)
    if reset is None:
        raise TypeError(
            f"Materialization requires that the `{type(module).__name__}.reset_parameters` method is implemented:"
            " it initialises the module's own parameters and buffers after they are allocated. Define it, or create"
            " the module on a real device."
        )
    if callable(reset):
        reset()


def _materialize_meta_tensors(module: Module, device: _DEVICE) -> None:
    """:func:`_materialize` every submodule of ``module`` that holds meta-device tensors."""
    for submodule in module.modules():
        if _has_meta_device_parameters_or_buffers(submodule, recurse=False):
            _materialize(submodule, device)


def _materialize_distributed_module(module: Module, device: torch.device) -> None:
    """Allocate a (possibly sharded) meta-device ``module`` on ``device`` and run every ``reset_parameters()``;
    submodules without one keep uninitialised memory, with a warning naming them."""
    if not _has_meta_device_parameters_or_buffers(module):
        return
    module.to_empty(device=device)  # on the root: keeps DTensor shards and tied parameters as they are
    uninitialised = set()
    for submodule in module.modules():
        if not any(itertools.chain(submodule.parameters(recurse=False), submodule.buffers(recurse=False))):
            continue
        reset = getattr(submodule, "reset_parameters", None)
        if callable(reset):
            reset()
        else:
            uninitialised.add(type(submodule).__name__)
    if uninitialised:
        rank_zero_warn(
            "Parameter initialization incomplete. The following modules have parameters or buffers with uninitialized"
            " memory because they don't define a `reset_parameters()` method for re-initialization:"
            f" {', '.join(sorted(uninitialised))}"
        )
