"""Preparing hyperparameters and metrics for a logger (Lightning Fabric's private ``utilities.logger`` helpers,
which custom loggers import)."""

from __future__ import annotations

import inspect
import json
from argparse import Namespace
from collections.abc import Mapping, MutableMapping
from dataclasses import asdict, is_dataclass
from typing import Any

import numpy as np
from torch import Tensor


def _convert_params(params: dict[str, Any] | Namespace | None) -> dict[str, Any]:
    """``params`` as a dict: a ``Namespace``'s attributes, ``{}`` for ``None``."""
    if isinstance(params, Namespace):
        return vars(params)
    return {} if params is None else params


def _sanitize_callable_params(params: dict[str, Any]) -> dict[str, Any]:
    """Replace a class by its name, another callable by what it returns without arguments (by its name where that fails
    or gives a callable)."""

    def sanitize(value: Any) -> Any:
        if inspect.isclass(value):
            return value.__name__
        if not callable(value):
            return value
        try:
            result = value()
        except Exception:  # any failure: the name is the best description left
            return getattr(value, "__name__", None)
        return value.__name__ if callable(result) else result

    return {key: sanitize(value) for key, value in params.items()}


def _flatten_dict(params: MutableMapping[Any, Any], delimiter: str = "/", parent_key: str = "") -> dict[str, Any]:
    """Flatten nested dicts (and dataclasses, namespaces, lists of dicts) into ``"outer/inner"`` keys."""
    flat: dict[str, Any] = {}
    for key, value in params.items():
        name = f"{parent_key}{delimiter}{key}" if parent_key else str(key)
        if is_dataclass(value) and not isinstance(value, type):
            value = asdict(value)
        elif isinstance(value, Namespace):
            value = vars(value)
        if isinstance(value, MutableMapping):
            flat.update(_flatten_dict(value, delimiter=delimiter, parent_key=name))
        elif isinstance(value, list) and all(isinstance(item, MutableMapping) for item in value):
            for index, item in enumerate(value):
                flat.update(_flatten_dict(item, delimiter=delimiter, parent_key=f"{name}/{index}"))
        else:
            flat[name] = value
    return flat


def _sanitize_params(params: dict[str, Any]) -> dict[str, Any]:
    """In place: NumPy scalars become numbers; values other than bool, int, float, str or tensor their ``str()``."""
    for key, value in params.items():
        if isinstance(value, (np.bool_, np.integer, np.floating)):
            params[key] = value = value.item()
        if type(value) not in (bool, int, float, str, Tensor):
            params[key] = str(value)
    return params


def _is_json_serializable(value: Any) -> bool:
    """Whether ``json.dumps`` can encode ``value``."""
    if value is None or isinstance(value, (bool, int, float, str, list, dict)):
        return True
    try:
        json.dumps(value)
    except (TypeError, OverflowError):
        return False
    return True


def _convert_json_serializable(params: dict[str, Any]) -> dict[str, Any]:
    """``params`` with every value JSON cannot encode replaced by its ``str()``."""
    return {key: value if _is_json_serializable(value) else str(value) for key, value in params.items()}


def _add_prefix(metrics: Mapping[str, Any], prefix: str, separator: str) -> Mapping[str, Any]:
    """``metrics`` with keys ``f"{prefix}{separator}{name}"``; ``metrics`` itself without a prefix."""
    return {f"{prefix}{separator}{name}": value for name, value in metrics.items()} if prefix else metrics
