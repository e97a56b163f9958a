"""``torch.compile`` and ``Fabric.setup``: take a compiled module apart, let the strategy set up the original, and
compile the result again with the same settings (its ``dynamo_ctx``), so that DDP's hooks run inside the compiled
graph. A compiled module is recognised by its class name: nothing here imports ``torch._dynamo``."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

#: the name under which ``OptimizedModule`` registers the module it compiles
_ORIG_MOD = "_orig_mod"


def is_compiled(module: object) -> bool:
    """Whether ``module`` is the wrapper that ``torch.compile(module)`` returns (an ``OptimizedModule``)."""
    return type(module).__name__ == "OptimizedModule" and isinstance(getattr(module, _ORIG_MOD, None), nn.Module)


def uncompiled(module: Any) -> Any:
    """``module`` without ``torch.compile``'s wrapper (``module`` itself when it is not compiled)."""
    return getattr(module, _ORIG_MOD) if is_compiled(module) else module


class Compiler:
    """The settings of one ``torch.compile`` call (``context``: its ``dynamo_ctx``), to apply to other modules.

    Example::

        module, compiler = unwrap_compiled(torch.compile(model, fullgraph=True))
        ddp = compiler.wrap(DistributedDataParallel(module))  # compiled with fullgraph=True
    """

    def __init__(self, context: Any) -> None:
        self._context = context

    def wrap(self, module: nn.Module) -> nn.Module:
        """``torch.compile(module, <the same settings>)``, with state dict keys free of ``_orig_mod.``."""
        compiled: nn.Module = self._context(module)
        clean_state_dict_keys(compiled)
        return compiled

    def compile_in_place(self, module: nn.Module) -> None:
        """``module.compile(<the same settings>)``: calls of ``module`` run compiled, with no wrapper added. An
        ``AsyncCollectiveTensor`` argument is waited on first, its gradient passed straight back: compiled as it is,
        its gradient would be silently dropped."""
        # what nn.Module.compile does with torch.compile's arguments, here with the context that holds them
        compiled = self._context(module._call_impl)

        def call(*args: Any, **kwargs: Any) -> Any:
            return compiled(*map(_waited, args), **{key: _waited(value) for key, value in kwargs.items()})

        module._compiled_call_impl = call

    def compile_units(self, root: nn.Module, units: Iterable[nn.Module]) -> None:
        """Compile each module of ``units`` in place, block by block as torchtitan does for sharded models (the
        ``root`` only where ``units`` holds nothing else): the collectives between the blocks (``fully_shard``'s
        all-gathers) stay eager, and a 2-D (tensor + data parallel) model cannot be compiled whole."""
        for block in [unit for unit in units if unit is not root] or [root]:
            self.compile_in_place(block)


class _WaitedInput(torch.autograd.Function):
    """The plain tensor under an ``AsyncCollectiveTensor``, once its collective is done; identity for autograd."""

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor) -> torch.Tensor:
        waited: torch.Tensor = tensor.trigger_wait()  # type: ignore[attr-defined]
        return waited

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        return grad


def _waited(value: Any) -> Any:
    """``value``, or the waited plain tensor if it is an ``AsyncCollectiveTensor`` (known by its class name)."""
    if type(value).__name__ == "AsyncCollectiveTensor":
        return _WaitedInput.apply(value) if value.requires_grad else value.trigger_wait()  # type: ignore[no-untyped-call]
    return value


def unwrap_compiled(module: nn.Module) -> tuple[nn.Module, Compiler | None]:
    """The module under ``torch.compile``'s wrapper and a :class:`Compiler` for its settings; ``(module, None)``
    for a module that is not compiled.

    Raises:
        RuntimeError: the compiled wrapper holds no compile context to reapply.
    """
    if not is_compiled(module):
        return module, None
    context = getattr(module, "dynamo_ctx", None)
    if not callable(context):
        raise RuntimeError(
            f"fabric.setup cannot read the torch.compile settings of this compiled {type(module).__name__} (it has"
            f" no callable `dynamo_ctx`, got {context!r}) to apply them again after the strategy has wrapped the"
            " model. Pass `_reapply_compile=False` to fabric.setup/setup_module, or compile after setting up:"
            " model = torch.compile(fabric.setup(model))."
        )
    return getattr(module, _ORIG_MOD), Compiler(context)


def clean_state_dict_keys(compiled: nn.Module) -> None:
    """Make ``compiled`` (an ``OptimizedModule``) save its state dict without ``_orig_mod.`` and load it with or
    without, wherever it sits, so that checkpoints of compiled and eager models are interchangeable."""
    if getattr(compiled, "_fabric_clean_keys", False):
        return
    compiled.register_state_dict_post_hook(_drop_orig_mod)  # type: ignore[no-untyped-call]
    compiled.register_load_state_dict_pre_hook(_add_orig_mod)  # type: ignore[no-untyped-call]
    object.__setattr__(compiled, "_fabric_clean_keys", True)


def _rename_under(mapping: dict[str, Any], prefix: str, rename: Any) -> None:
    """Rename, in place and keeping the order, the keys of ``mapping`` that start with ``prefix``."""
    items = list(mapping.items())
    if not any(key.startswith(prefix) for key, _ in items):
        return
    mapping.clear()
    for key, value in items:
        mapping[rename(key) if key.startswith(prefix) else key] = value


def _drop_orig_mod(module: nn.Module, state_dict: dict[str, Any], prefix: str, local_metadata: Any) -> None:
    inner = f"{prefix}{_ORIG_MOD}"

    def rename(key: str) -> str:
        if key == inner:  # the metadata entry of the wrapped module: it takes the wrapper's place
            return prefix[:-1]
        return prefix + key[len(inner) + 1 :] if key.startswith(inner + ".") else key

    _rename_under(state_dict, inner, rename)
    metadata = getattr(state_dict, "_metadata", None)
    if isinstance(metadata, dict):
        _rename_under(metadata, inner, rename)


def _add_orig_mod(
    module: nn.Module,
    state_dict: dict[str, Any],
    prefix: str,
    local_metadata: Any,
    strict: bool,
    missing_keys: list[str],
    unexpected_keys: list[str],
    error_msgs: list[str],
) -> None:
    inner = f"{prefix}{_ORIG_MOD}."
    # the keys of a checkpoint saved from the eager module (or by Fabric) under this wrapper's prefix
    _rename_under(state_dict, prefix, lambda key: key if key.startswith(inner) else inner + key[len(prefix) :])


def take_apart_compiled(module: nn.Module, reapply: bool) -> tuple[nn.Module, Compiler | None]:
    """``(module to set up, compiler)`` for ``Fabric.setup(module, _reapply_compile=reapply)``: with ``reapply``
    the uncompiled module and its compiler, else the module as it is and ``None``. Every compiled wrapper inside
    gets state dict keys without ``_orig_mod.``."""
    for submodule in module.modules():
        if is_compiled(submodule):
            clean_state_dict_keys(submodule)
    return unwrap_compiled(module) if reapply else (module, None)
