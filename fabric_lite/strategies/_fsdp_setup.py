"""How :class:`~fabric_lite.strategies.fsdp.FSDPStrategy` shards a module, one plain function per capability: wrap
policies, activation checkpointing, ``sync_module_states``, materialising meta-device parameters as an eager
construction would, and rebinding optimizers to the sharded parameters."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeAlias

import torch
from torch import Tensor, nn
from torch.nn import Module
from torch.optim import Optimizer

from fabric_lite.utilities.rank_zero import rank_zero_warn

if TYPE_CHECKING:
    from torch.distributed.fsdp.wrap import _Policy

#: which submodules to shard as units: layer classes, a predicate ``(module) -> bool``, a minimum number of
#: parameters a subtree must hold (outside units inside it), or an FSDP1 policy (``ModuleWrapPolicy``, or
#: ``fn(module, recurse, nonwrapped_numel) -> bool``)
AutoWrapPolicy: TypeAlias = "set[type[Module]] | Callable[..., bool] | int | _Policy | None"
#: a function that initialises the parameters and buffers that ``module`` itself holds (not its children's)
ParamInitFn: TypeAlias = Callable[[Module], None]


def _is_module_class(obj: Any) -> bool:
    return isinstance(obj, type) and issubclass(obj, Module)


def module_classes(value: Any, argument: str) -> frozenset[type[Module]]:
    """``value`` (one ``nn.Module`` subclass or a set/list/tuple of them) as a frozenset; ``TypeError`` otherwise."""
    classes = [value] if _is_module_class(value) else value
    if not isinstance(classes, (set, frozenset, list, tuple)) or not all(_is_module_class(c) for c in classes):
        raise TypeError(
            f"FSDPStrategy({argument}={value!r}): expected a set of nn.Module subclasses, e.g. {argument}={{Block}}."
        )
    return frozenset(classes)


def check_wrap_policy(policy: Any, argument: str = "auto_wrap_policy") -> AutoWrapPolicy:
    """Validate a policy (an :data:`AutoWrapPolicy`) given as ``argument``; ``TypeError``/``ValueError`` if not one."""
    if policy is None:
        return None
    if isinstance(policy, bool):
        raise TypeError(f"FSDPStrategy({argument}={policy!r}) is not a policy. {_POLICY_FORMS}")
    if isinstance(policy, int):
        if policy < 1:
            raise ValueError(
                f"FSDPStrategy({argument}={policy}): a minimum parameter count must be >= 1. {_POLICY_FORMS}"
            )
        return policy
    if _is_module_class(policy) or isinstance(policy, (set, frozenset, list, tuple)):
        return set(module_classes(policy, argument))
    if _is_fsdp1_policy_object(policy) or callable(policy):
        return policy  # type: ignore[no-any-return]
    raise TypeError(f"FSDPStrategy({argument}={policy!r}) is not a policy. {_POLICY_FORMS}")


_POLICY_FORMS = (
    "Pass a set of layer classes ({Block}), a function module -> bool, a minimum number of parameters per unit"
    " (e.g. 1_000_000), or an FSDP1 policy (ModuleWrapPolicy, or fn(module, recurse, nonwrapped_numel))."
)


def _is_fsdp1_policy_object(policy: Any) -> bool:
    """Whether ``policy`` is one of FSDP1's policy objects (``ModuleWrapPolicy``, ``CustomPolicy``)."""
    try:
        from torch.distributed.fsdp.wrap import _Policy
    except ImportError:  # pragma: no cover - a torch without FSDP1
        return False
    return isinstance(policy, _Policy)


def _takes_fsdp1_arguments(fn: Callable[..., Any]) -> bool:
    """Whether ``fn`` is an FSDP1 policy function ``fn(module, recurse, nonwrapped_numel)``, not ``fn(module)``."""
    try:
        parameters = inspect.signature(fn).parameters
    except (TypeError, ValueError):  # a builtin without a signature: a predicate
        return False
    return "recurse" in parameters and "nonwrapped_numel" in parameters


def wrap_targets(root: Module, policy: AutoWrapPolicy) -> list[Module]:
    """The submodules of ``root`` (never ``root`` itself) that ``policy`` makes sharded units, descendants before
    their ancestors, as ``fully_shard`` needs. FSDP1's policies choose what they would choose under FSDP1."""
    if policy is None:
        return []
    # reversed pre-order puts every descendant before its ancestors
    candidates = [m for m in reversed(list(root.modules())) if m is not root]
    if _is_fsdp1_policy_object(policy):
        chosen = policy._run_policy(root, set(), {})  # type: ignore[union-attr]
        return [m for m in candidates if m in chosen]
    if callable(policy) and _takes_fsdp1_arguments(policy):
        return _fsdp1_function_targets(root, policy)
    if isinstance(policy, int):
        targets: list[Module] = []

        def visit(module: Module) -> int:
            held = sum(p.numel() for p in module.parameters(recurse=False))
            held += sum(visit(child) for child in module.children())
            if module is not root and held >= policy:
                targets.append(module)  # appended after its children: children first
                return 0
            return held

        visit(root)
        return targets
    if isinstance(policy, (set, frozenset)):
        classes = tuple(policy)
        return [m for m in candidates if isinstance(m, classes)]
    return [m for m in candidates if policy(m)]  # type: ignore[operator]


def _fsdp1_function_targets(root: Module, policy: Callable[..., bool]) -> list[Module]:
    targets: list[Module] = []

    def visit(module: Module) -> int:  # the parameters that end up in units at or below ``module``
        total = sum(p.numel() for p in module.parameters())
        if not policy(module=module, recurse=True, nonwrapped_numel=total):
            return 0
        inside = sum(visit(child) for child in module.children())
        if module is not root and policy(module=module, recurse=False, nonwrapped_numel=total - inside):
            targets.append(module)  # after the units inside it: children first
            return total
        return inside

    visit(root)
    return targets


def apply_activation_checkpointing(root: Module, policy: AutoWrapPolicy) -> int:
    """Recompute in backward the activations of the submodules ``policy`` chooses (as :func:`wrap_targets`); return
    how many. Parameter names are unchanged. Must run before ``fully_shard``."""
    from torch.distributed._composable.checkpoint_activation import checkpoint

    found = wrap_targets(root, policy)
    for module in found:
        checkpoint(module)
    return len(found)


def broadcast_from_rank_zero(tensors: list[Tensor], device: torch.device) -> None:
    """Overwrite each of ``tensors`` in place with global rank 0's value, one at a time through ``device`` (NCCL
    sends device memory only). Every rank must call it with the same shapes."""
    import torch.distributed as dist

    with torch.no_grad():
        for tensor in tensors:
            staged = tensor.detach().to(device)
            dist.broadcast(staged, src=0)
            if staged is not tensor:
                tensor.copy_(staged)


@dataclass
class MetaOwner:
    """A module that holds parameters or buffers on the meta device itself (not through a child)."""

    name: str
    module: Module
    params: list[str]
    buffers: list[str]


def meta_owners(root: Module) -> list[MetaOwner]:
    """Every module holding meta-device parameters/buffers of its own, in construction (``root.modules()``) order."""
    owners = []
    for name, module in root.named_modules():
        params = [n for n, p in module.named_parameters(recurse=False) if p.is_meta]
        buffers = [n for n, b in module.named_buffers(recurse=False) if b.is_meta]
        if params or buffers:
            owners.append(MetaOwner(name or "<root>", module, params, buffers))
    return owners


def check_initialisable(root: Module, owners: list[MetaOwner], param_init_fn: ParamInitFn | None) -> None:
    """Check, before sharding, that the meta-device module can be materialised; warn, as Lightning does, about
    modules with no ``reset_parameters()`` nor ``param_init_fn`` (left uninitialised, for a checkpoint to fill).

    Raises:
        RuntimeError: the module holds real tensors beside the meta ones.
    """
    real = [n for n, t in [*root.named_parameters(), *root.named_buffers()] if not t.is_meta]
    if real:
        shown = ", ".join(real[:5]) + (", ..." if len(real) > 5 else "")
        raise RuntimeError(
            f"The module holds tensors on the meta device and {len(real)} real one(s) ({shown}). Materialising the"
            " meta tensors at setup would overwrite the real ones: create the whole model under"
            " fabric.init_module(empty_init=True), or none of it."
        )
    missing = [o for o in owners if _initialiser(o.module, param_init_fn) is None]
    if missing:
        kinds = ", ".join(dict.fromkeys(type(o.module).__name__ for o in missing))
        shown = ", ".join(o.name for o in missing[:5]) + (", ..." if len(missing) > 5 else "")
        rank_zero_warn(
            "Parameter initialization incomplete. The following modules have parameters or buffers with"
            " uninitialized memory because they don't define a `reset_parameters()` method for re-initialization:"
            f" {kinds} ({shown}). Load a checkpoint into them after setup, define reset_parameters() on them"
            " (initialising only their own tensors), or create the model without empty_init=True.",
            category=UserWarning,
        )


def _initialiser(module: Module, param_init_fn: ParamInitFn | None) -> Callable[[], None] | None:
    """``param_init_fn(module)``, else ``module.reset_parameters``; ``None`` when there is neither."""
    if param_init_fn is not None:
        return lambda: param_init_fn(module)
    reset = getattr(module, "reset_parameters", None)
    return reset if callable(reset) else None


def materialize(
    root: Module,
    owners: list[MetaOwner],
    device: torch.device,
    param_init_fn: ParamInitFn | None,
    buffer_device: torch.device | None = None,
    sync: Callable[[list[Tensor]], None] | None = None,
) -> None:
    """Allocate the meta tensors of the sharded ``root`` on ``device`` (buffers on ``buffer_device``) and initialise
    them one module at a time: each owner's tensors are created whole on the CPU, initialised in construction order
    from the global CPU generator, then this rank's shards copied into place. The values thus equal an eager
    construction's with the same seed (tied weights included), with one module's full tensors alive at a time.
    ``sync``, when given, makes each module's full values equal on every rank before sharding."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    root.to_empty(device=device)  # each rank's shards (and whole buffers), uninitialised
    done: set[int] = set()
    for owner in owners:
        module = owner.module
        initialise = _initialiser(module, param_init_fn)
        if initialise is None:  # left uninitialised, as check_initialisable warned
            continue
        real = {n: module.get_parameter(n) for n in owner.params}
        real_buffers = {n: module.get_buffer(n) for n in owner.buffers}
        try:
            for n, p in real.items():
                module._parameters[n] = nn.Parameter(torch.empty(p.shape, dtype=p.dtype), p.requires_grad)
            for n, b in real_buffers.items():
                module._buffers[n] = torch.empty(b.shape, dtype=b.dtype)
            with torch.no_grad():
                initialise()
                if sync is not None:
                    sync([t for t in [*module._parameters.values(), *module._buffers.values()] if t is not None])
                for n, p in real.items():
                    full = module.get_parameter(n)
                    if id(p) in done:
                        continue
                    if isinstance(p, DTensor):
                        shard = distribute_tensor(full.detach(), p.device_mesh, p.placements, src_data_rank=None)
                        p.to_local().copy_(shard.to_local())
                    else:
                        p.copy_(full)
                    done.add(id(p))
                for n, b in real_buffers.items():
                    b.copy_(module.get_buffer(n))
        finally:
            module._parameters.update(real)
            module._buffers.update(real_buffers)
    if buffer_device is not None and buffer_device != device:
        for module in root.modules():
            for name, buffer in module._buffers.items():
                if buffer is not None:
                    module._buffers[name] = buffer.to(buffer_device)


def optimizer_parameter_names(module: Module, optimizers: list[Optimizer], strategy: str) -> dict[int, str]:
    """The name in ``module`` of every parameter the ``optimizers`` hold (by ``id``), for :func:`rebind_optimizer`.

    Raises:
        ValueError: an optimizer holds state (which belongs to the replaced tensors), or a parameter that is not
            one of ``module``'s.
    """
    names = {id(p): name for name, p in module.named_parameters()}
    for optimizer in optimizers:
        holding = sum(1 for state in optimizer.state.values() if state)
        if holding:
            raise ValueError(
                f"The {type(optimizer).__name__} optimizer passed to fabric.setup() with {strategy} already holds"
                f" state for {holding} parameter(s) (it has stepped, or creates its state when it is"
                " constructed); setting the module up replaces the parameters, and that state belongs to the old"
                " ones. Create the optimizer without stepping it before fabric.setup(model, optimizer), or set up"
                " the module first: model = fabric.setup_module(model); optimizer ="
                " fabric.setup_optimizers(torch.optim.AdamW(model.parameters()))."
            )
        foreign = sum(1 for group in optimizer.param_groups for p in group["params"] if id(p) not in names)
        if foreign:
            raise ValueError(
                f"The {type(optimizer).__name__} optimizer holds {foreign} parameter(s) that are not parameters of"
                f" the {type(module).__name__} being set up with it. Pass each optimizer with the module whose"
                " parameters it updates."
            )
    return names


def rebind_optimizer(optimizer: Optimizer, names: Mapping[int, str], parameters: Mapping[str, Tensor]) -> None:
    """Replace every parameter in ``optimizer``'s group lists, in place (``LBFGS`` keeps a reference), by the one of
    the same name among ``parameters``.

    Raises:
        ValueError: a name is not among ``parameters`` (the set-up module renamed or dropped the parameter).
    """
    for group in optimizer.param_groups:
        params = group["params"]
        for index, param in enumerate(params):
            name = names[id(param)]
            if name not in parameters:
                raise ValueError(
                    f"The {type(optimizer).__name__} optimizer updates the parameter {name!r}, which the set-up module"
                    " no longer has under that name (its parameters were replaced when it was set up), so the"
                    " optimizer cannot be pointed at its replacement. Set up the module first, then create the"
                    " optimizer: model = fabric.setup_module(model); optimizer ="
                    " fabric.setup_optimizers(torch.optim.AdamW(model.parameters()))."
                )
            params[index] = parameters[name]
