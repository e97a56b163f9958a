"""Utilities: collection helpers, seeding, data loading and checkpoint files.

``progress_bar``/``ProgressBar`` and ``consolidate_checkpoint`` are imported on first use, so that
``import fabric_lite`` stays fast.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from fabric_lite.utilities.apply_func import apply_to_collection, convert_to_tensors, move_data_to_device
from fabric_lite.utilities.checkpoint import CheckpointError
from fabric_lite.utilities.exceptions import MisconfigurationException
from fabric_lite.utilities.seed import RandomState, seed_everything

if TYPE_CHECKING:
    from fabric_lite.utilities._dcp import consolidate_checkpoint
    from fabric_lite.utilities.progress import ProgressBar, progress_bar

_LAZY = {
    "consolidate_checkpoint": "fabric_lite.utilities._dcp",
    "ProgressBar": "fabric_lite.utilities.progress",
    "progress_bar": "fabric_lite.utilities.progress",
}

__all__ = [
    "CheckpointError",
    "MisconfigurationException",
    "ProgressBar",
    "RandomState",
    "apply_to_collection",
    "consolidate_checkpoint",
    "convert_to_tensors",
    "move_data_to_device",
    "progress_bar",
    "seed_everything",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
