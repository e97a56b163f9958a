"""Lightning Fabric's ``utilities.registry``: callbacks that installed packages offer through entry points."""

from __future__ import annotations

from importlib.metadata import entry_points
from typing import Any

from fabric_lite._log import get_logger

_log = get_logger(__name__)


def _load_external_callbacks(group: str) -> list[Any]:
    """The callbacks of every factory under the entry-point ``group`` (a function returning a callback or a list of
    them), each called once."""
    callbacks: list[Any] = []
    for entry_point in entry_points(group=group):
        made = entry_point.load()()
        found = made if isinstance(made, list) else [made]
        if found:
            names = ", ".join(type(callback).__name__ for callback in found)
            _log.info(f"Adding {len(found)} callbacks from entry point {entry_point.name!r}: {names}")
        callbacks.extend(found)
    return callbacks


__all__ = ["_load_external_callbacks"]
