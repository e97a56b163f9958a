"""Callbacks and loggers as ``Fabric`` holds them: validated once, called by name, finalized at the end."""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Callable
from typing import Any


def as_list(value: Any) -> list[Any]:
    """``value`` as a list: ``[]`` for ``None``, a list or tuple's items, else ``[value]``."""
    if value is None:
        return []
    return list(value) if isinstance(value, (list, tuple)) else [value]


def configure_callbacks(callbacks: Any) -> list[Any]:
    """``Fabric(callbacks=...)`` (one object or a list or tuple) as a list; ``TypeError`` for a class."""
    found = as_list(callbacks)
    for index, callback in enumerate(found):
        if isinstance(callback, type):
            raise TypeError(
                f"Fabric(callbacks=...) got the class {callback.__name__} at position {index}; pass an instance:"
                f" callbacks=[{callback.__name__}()]."
            )
    return found


def configure_loggers(loggers: Any) -> list[Any]:
    """``Fabric(loggers=...)`` (one logger or a list or tuple) as a list; ``TypeError`` for a class or an object
    without a callable ``log_metrics(metrics, step)``."""
    found = as_list(loggers)
    for index, logger in enumerate(found):
        if isinstance(logger, type):
            raise TypeError(
                f"Fabric(loggers=...) got the class {logger.__name__} at position {index}; pass an instance, e.g."
                f" loggers={logger.__name__}(root_dir='logs')."
            )
        if not callable(getattr(logger, "log_metrics", None)):
            raise TypeError(
                f"Fabric(loggers=...) got {logger!r} ({type(logger).__name__}) at position {index}, which has no"
                " log_metrics(metrics, step) method. Pass loggers such as fabric_lite.loggers.CSVLogger('logs') or"
                " TensorBoardLogger('logs'), or a subclass of fabric_lite.loggers.Logger."
            )
    return found


def call_hook(callbacks: list[Any], hook_name: str, args: tuple[Any, ...], kwargs: dict[str, Any], warn: bool) -> None:
    """Call ``hook_name`` on every callback that has it, with ``args`` and the ``kwargs`` its signature accepts.

    Raises:
        TypeError: a method cannot take these arguments; the message names the callback and its signature.
    """
    for callback in callbacks:
        method = getattr(callback, hook_name, None)
        if method is None:
            continue
        if not callable(method):
            if warn:
                warnings.warn(
                    f"Skipping the callback `{type(callback).__name__}.{hook_name}` because it is not callable"
                    f" (it is a {type(method).__name__}).",
                    UserWarning,
                    stacklevel=3,
                )
            continue
        try:
            signature = inspect.signature(method)
        except (TypeError, ValueError):  # some builtins have no signature: pass everything, as Lightning does
            method(*args, **kwargs)
            continue
        accepted = accepted_kwargs(signature, kwargs)
        # check the binding first, so that a TypeError raised inside the callback is never mistaken for it
        try:
            signature.bind(*args, **accepted)
        except TypeError as err:
            raise TypeError(
                f"fabric.call({hook_name!r}) cannot call {type(callback).__name__}.{hook_name}{signature} with"
                f" {len(args)} positional argument(s) and keyword(s) {sorted(accepted)}: {err}. Pass hook"
                " arguments by keyword (fabric.call(hook, name=value)): each callback then receives only the"
                " ones its signature names."
            ) from None
        method(*args, **accepted)


def accepted_kwargs(signature: inspect.Signature, kwargs: dict[str, Any]) -> dict[str, Any]:
    """The entries of ``kwargs`` that ``signature`` takes by keyword (all of them if it has ``**kwargs``)."""
    parameters = signature.parameters.values()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        return kwargs
    by_keyword = {
        p.name
        for p in parameters
        if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    }
    return {name: value for name, value in kwargs.items() if name in by_keyword}


def finalize_loggers(loggers: list[Any], status: str) -> None:
    """``logger.finalize(status)`` for every logger that has it; after a failure a logger's error only warns, so
    that it does not hide the failure."""
    for logger in loggers:
        finalize: Callable[[str], Any] | None = getattr(logger, "finalize", None)
        if not callable(finalize):
            continue
        try:
            finalize(status)
        except Exception as err:
            if status == "success":
                raise
            warnings.warn(f"{type(logger).__name__}.finalize({status!r}) failed: {err!r}", UserWarning, stacklevel=2)
