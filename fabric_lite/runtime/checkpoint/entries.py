"""What a checkpoint holds, whatever its format: the entries of a ``state`` dict turned into state dicts to save
(:func:`to_state_dicts`), and restored from what was loaded (:func:`restore_entries`, :func:`check_missing`)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from torch.nn import Module
from torch.optim import Optimizer

from fabric_lite.utilities.types import _Stateful

#: where ``save_checkpoint`` keeps the precision's state (a loss scaler's); ``load_checkpoint`` restores it
PRECISION_KEY = "fabric_lite:precision"


def _apply_filter(
    key: str, filter: dict[str, Callable[[str, Any], bool]], source_dict: object, target_dict: dict[str, Any]
) -> None:
    """Put ``source_dict`` into ``target_dict[key]``; where ``filter`` has a predicate for ``key`` and the source is a
    dict, only the items it keeps, and no entry when it keeps none (Lightning Fabric's helper for
    ``save_checkpoint(filter=...)``)."""
    if key in filter and isinstance(source_dict, dict):
        keep = filter[key]
        for name, value in source_dict.items():
            if keep(name, value):
                target_dict.setdefault(key, {})[name] = value
    else:
        target_dict[key] = source_dict


def to_state_dicts(
    state: dict[str, Any],
    filter: dict[str, Callable[[str, Any], bool]],
    module_state: Callable[[Module], Any],
    optimizer_state: Callable[[Optimizer], Any],
    precision_state: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The checkpoint to save for ``state``: modules through ``module_state``, optimizers through ``optimizer_state``,
    stateful objects by ``state_dict()``, other values as they are, each filtered by :func:`_apply_filter`; a non-empty
    ``precision_state`` under :data:`PRECISION_KEY`."""
    checkpoint: dict[str, Any] = {}
    for key, obj in state.items():
        if isinstance(obj, Module):
            value = module_state(obj)
        elif isinstance(obj, Optimizer):
            value = optimizer_state(obj)
        elif isinstance(obj, _Stateful) and not isinstance(obj, type):
            value = obj.state_dict()
        else:
            value = obj
        _apply_filter(key, filter, value, checkpoint)
    if precision_state:
        checkpoint.setdefault(PRECISION_KEY, precision_state)
    return checkpoint


def pop_precision(checkpoint: Any, load_precision: Callable[[Any], Any]) -> None:
    """Hand the precision's saved state (a loss scaler's) to ``load_precision``, out of ``checkpoint``: it goes back
    into the precision, never to the caller."""
    if isinstance(checkpoint, dict) and PRECISION_KEY in checkpoint:
        load_precision(checkpoint.pop(PRECISION_KEY))


def check_missing(path: Any, wanted: Iterable[str], available: Iterable[str], strict: bool) -> None:
    """With ``strict``, raise the ``KeyError`` of :func:`missing_entries_error` for the ``wanted`` entries not in
    ``available``."""
    available = list(available)
    missing = [key for key in wanted if key not in available]
    if strict and missing:
        raise missing_entries_error(path, missing, available)


def missing_entries_error(path: Any, missing: list[str], available: Iterable[str]) -> KeyError:
    """The ``KeyError`` of a strict load: the checkpoint at ``path`` lacks the entries ``missing`` (the first one in
    Lightning Fabric's words), and has ``available``."""
    return KeyError(
        f"The requested state contains a key {missing[0]!r} that does not exist in the loaded checkpoint"
        f" {str(path)!r} (missing: {missing}; it has {sorted(available)}). To restore only the entries it has, set"
        " `strict=False`."
    )


def restore_entries(
    state: dict[str, Any],
    checkpoint: dict[str, Any],
    path: Any,
    strict: bool,
    load_module: Callable[[Module, Any], Any],
    load_optimizer: Callable[[Optimizer, Any], Any] | None = None,
) -> None:
    """Restore ``state``'s entries from ``checkpoint``, popping each one restored: modules through ``load_module``,
    optimizers through ``load_optimizer`` (by default their ``load_state_dict``, like other stateful objects), plain
    values by replacement in ``state``. What stays in ``checkpoint`` is the remainder. With ``strict``, an entry the
    checkpoint lacks raises ``KeyError`` naming both sides.

    Example::

        restore_entries(state, checkpoint, "last.ckpt", True, lambda module, value: module.load_state_dict(value))
    """
    check_missing(path, state, checkpoint, strict)
    for key, obj in list(state.items()):
        if key not in checkpoint:
            continue
        value = checkpoint.pop(key)
        if isinstance(obj, Module):
            load_module(obj, value)
        elif isinstance(obj, Optimizer) and load_optimizer is not None:
            load_optimizer(obj, value)
        else:
            load_or_replace(state, key, value)


def load_or_replace(state: dict[str, Any], key: str, value: Any) -> None:
    """Load ``value`` into ``state[key]`` where that is a stateful object (``load_state_dict``), else replace it."""
    obj = state[key]
    if isinstance(obj, _Stateful) and not isinstance(obj, type):
        obj.load_state_dict(value)
    else:
        state[key] = value
