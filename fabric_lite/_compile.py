"""``torch.compile`` and ``Fabric.setup``: take a compiled module apart, let the strategy set up the original, and
compile the result again with the user's own settings.

Why again: compiling ``DistributedDataParallel(model)`` rather than wrapping the compiled ``model`` in DDP puts DDP's
gradient bucketing inside the compiled graph (as Lightning does, ``_reapply_compile=True``).

Where the settings come from: ``torch.compile(model, backend=..., mode=..., fullgraph=..., dynamic=..., options=...)``
returns an ``OptimizedModule`` whose ``dynamo_ctx`` holds every one of them (the backend with its mode and
options, ``fullgraph``, ``dynamic``). Applying that same context to another module is what ``torch.compile`` itself
does, so the recompiled module gets exactly the user's settings without patching ``torch.compile`` at import (which
is how Lightning records them).

Nothing here imports ``torch._dynamo``: a compiled module is recognised by its class name, so ``import fabric_lite``
stays light.
"""

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
    """``module`` without ``torch.compile``'s wrapper (``module`` itself when it is not compiled).

    Example::

        assert uncompiled(torch.compile(model)) is model and uncompiled(model) is model
    """
    return getattr(module, _ORIG_MOD) if is_compiled(module) else module


class Compiler:
    """The settings of one ``torch.compile`` call, taken from the ``OptimizedModule`` it returned, to apply again.

    Args:
        context: the compiled module's ``dynamo_ctx`` (backend, mode, options, ``fullgraph``, ``dynamic``).

    Example::

        compiled = torch.compile(model, backend="aot_eager", fullgraph=True)
        module, compiler = unwrap_compiled(compiled)  # module is model
        ddp = compiler.wrap(DistributedDataParallel(module))  # compiled with backend="aot_eager", fullgraph=True
    """

    def __init__(self, context: Any) -> None:
        self._context = context

    def wrap(self, module: nn.Module) -> nn.Module:
        """``torch.compile(module, <the same settings>)``: a new ``OptimizedModule`` around ``module``; its state
        dict carries no ``_orig_mod.`` prefix (see :func:`clean_state_dict_keys`)."""
        compiled: nn.Module = self._context(module)
        clean_state_dict_keys(compiled)
        return compiled

    def compile_in_place(self, module: nn.Module) -> None:
        """``module.compile(<the same settings>)``: calls of ``module`` run compiled, and nothing else changes (no
        wrapper, so no ``_orig_mod.`` in any state dict, and the parent module keeps it where it was).

        An argument that is an ``AsyncCollectiveTensor`` (what a tensor-parallel layer run eagerly before the
        module hands on, e.g. a sequence-parallel embedding's output) is waited on before the compiled call, its
        gradient passed straight back: torch 2.13 compiles such an input as one that needs no gradient and silently
        drops the gradient to whatever produced it (seen here: a 2 x 2 model's embedding got a zero gradient; the
        test ``test_a_compiled_block_passes_the_gradient_to_an_async_collective_input`` shows it).
        """
        # what nn.Module.compile does with torch.compile's arguments, here with the context that holds them
        compiled = self._context(module._call_impl)

        def call(*args: Any, **kwargs: Any) -> Any:
            return compiled(*map(_waited, args), **{key: _waited(value) for key, value in kwargs.items()})

        module._compiled_call_impl = call

    def compile_units(self, root: nn.Module, units: Iterable[nn.Module]) -> None:
        """Compile each module of ``units`` in place (block by block, as torchtitan does for sharded models); the
        ``root`` itself only where ``units`` holds nothing else.

        For sharding strategies (FSDP, and tensor + data parallel models): each unit's own forward is compiled,
        and the collectives around it (the parameter all-gather of ``fully_shard``, run from the unit's hooks)
        stay in eager mode between the compiled blocks. Compiling the whole sharded root also runs on the CPU
        with torch 2.13, but dynamo splits the graph at every unit anyway and the first compile takes several
        times longer; a whole 2-D (TP + FSDP2) model does not compile at all ("Mixing fake modes NYI").
        """
        blocks = [unit for unit in units if unit is not root]
        for block in blocks or [root]:
            self.compile_in_place(block)


class _WaitedInput(torch.autograd.Function):
    """The plain tensor under an ``AsyncCollectiveTensor``, once its collective is done; the gradient goes back
    unchanged (the identity, as far as autograd is concerned)."""

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor) -> torch.Tensor:
        waited: torch.Tensor = tensor.trigger_wait()  # type: ignore[attr-defined]
        return waited

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        return grad


def _waited(value: Any) -> Any:
    """``value``, or the waited plain tensor if it is an ``AsyncCollectiveTensor`` (recognised by its class name, so
    that nothing here imports ``torch.distributed``)."""
    if type(value).__name__ == "AsyncCollectiveTensor":
        return _WaitedInput.apply(value) if value.requires_grad else value.trigger_wait()  # type: ignore[no-untyped-call]
    return value


def unwrap_compiled(module: nn.Module) -> tuple[nn.Module, Compiler | None]:
    """The module under ``torch.compile``'s wrapper and the settings to compile it again; ``(module, None)`` for a
    module that is not compiled.

    Raises:
        RuntimeError: ``module`` is compiled, but its wrapper holds no compile context to reapply (a torch that
            changed ``OptimizedModule``).

    Example::

        module, compiler = unwrap_compiled(torch.compile(model, mode="max-autotune"))
        assert module is model and compiler is not None
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
    """Make the state dict of ``compiled`` (an ``OptimizedModule``) carry the keys of the module it compiles, wherever
    it sits (inside ``DistributedDataParallel`` too): ``state_dict`` drops the ``_orig_mod.`` it would add, and
    ``load_state_dict`` accepts keys without it (and still with it). Checkpoints of compiled and eager models are
    then interchangeable.

    Example::

        compiled = torch.compile(torch.nn.Linear(2, 2))
        clean_state_dict_keys(compiled)
        assert list(compiled.state_dict()) == ["weight", "bias"]
    """
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
    """``(module to set up, compiler)`` for ``Fabric.setup(module, _reapply_compile=reapply)``.

    With ``reapply``, a compiled module is set up uncompiled and compiled again afterwards (the compiler); the module
    to set up is also the original one (``fabric_model.module``). Without, the compiled module is set up as it is,
    and is the original one too, as in Lightning. Either way every compiled wrapper in it (the module itself, or
    blocks the user compiled one by one) gets state dict keys without ``_orig_mod.``.

    Example::

        module, compiler = take_apart_compiled(torch.compile(model), reapply=True)
        assert module is model and compiler is not None
    """
    for submodule in module.modules():
        if is_compiled(submodule):
            clean_state_dict_keys(submodule)
    return unwrap_compiled(module) if reapply else (module, None)
