"""Metric values as loggers take them: numbers, with one-element tensors turned into numbers."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torch import Tensor

from fabric_lite.utilities.apply_func import apply_to_collection


def _check_metrics(metrics: Any, caller: str) -> None:
    """Raise if ``metrics`` is not a mapping of names to values, or holds a tensor with more than one element."""
    if not isinstance(metrics, Mapping):
        raise TypeError(
            f"{caller} expects a dict of metric names to values, e.g. {{'loss': loss}}; got {type(metrics).__name__}:"
            f" {metrics!r}."
        )
    for name, value in metrics.items():
        if not isinstance(name, str):
            raise TypeError(f"{caller}: metric names must be strings, got {name!r} ({type(name).__name__}).")
        apply_to_collection(value, Tensor, _check_one_element, name, caller)


def _check_one_element(tensor: Tensor, name: str, caller: str) -> None:
    if tensor.numel() != 1:
        raise ValueError(
            f"{caller}: the metric {name!r} is a tensor with {tensor.numel()} elements (shape {tuple(tensor.shape)}),"
            " so it cannot be converted to a scalar. Only numbers and one-element tensors can be logged: log a"
            " reduction such as `.mean()`, or one name per element."
        )


def _to_scalars(metrics: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of ``metrics`` with every one-element tensor (also inside nested dicts) turned into a number."""
    return {name: apply_to_collection(value, Tensor, Tensor.item) for name, value in metrics.items()}
