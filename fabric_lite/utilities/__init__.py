"""Utilities, under the names of Lightning Fabric's ``utilities``; the progress bar, consolidation and throughput
helpers are imported on first use, so that ``import fabric_lite`` stays fast."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fabric_lite.utilities._lazy import lazy_getattr
from fabric_lite.utilities.apply_func import apply_to_collection, convert_to_tensors, move_data_to_device
from fabric_lite.utilities.enums import LightningEnum
from fabric_lite.utilities.exceptions import MisconfigurationException
from fabric_lite.utilities.rank_zero import rank_zero_deprecation, rank_zero_info, rank_zero_only, rank_zero_warn
from fabric_lite.utilities.seed import RandomState, seed_everything
from fabric_lite.utilities.warnings import disable_possible_user_warnings

if TYPE_CHECKING:
    from fabric_lite.runtime.checkpoint import CheckpointError
    from fabric_lite.utilities.consolidate import consolidate_checkpoint
    from fabric_lite.utilities.data import AttributeDict, suggested_max_num_workers
    from fabric_lite.utilities.distributed import is_shared_filesystem
    from fabric_lite.utilities.progress import ProgressBar, progress_bar
    from fabric_lite.utilities.throughput import Throughput, ThroughputMonitor, measure_flops

__getattr__ = lazy_getattr(
    __name__,
    {
        "AttributeDict": "fabric_lite.utilities.data",
        "suggested_max_num_workers": "fabric_lite.utilities.data",
        "is_shared_filesystem": "fabric_lite.utilities.distributed",
        "CheckpointError": "fabric_lite.runtime.checkpoint",
        "consolidate_checkpoint": "fabric_lite.utilities.consolidate",
        "ProgressBar": "fabric_lite.utilities.progress",
        "progress_bar": "fabric_lite.utilities.progress",
        "Throughput": "fabric_lite.utilities.throughput",
        "ThroughputMonitor": "fabric_lite.utilities.throughput",
        "measure_flops": "fabric_lite.utilities.throughput",
    },
)

__all__ = [
    "AttributeDict",
    "CheckpointError",
    "LightningEnum",
    "MisconfigurationException",
    "ProgressBar",
    "RandomState",
    "Throughput",
    "ThroughputMonitor",
    "apply_to_collection",
    "consolidate_checkpoint",
    "convert_to_tensors",
    "disable_possible_user_warnings",
    "is_shared_filesystem",
    "measure_flops",
    "move_data_to_device",
    "progress_bar",
    "rank_zero_deprecation",
    "rank_zero_info",
    "rank_zero_only",
    "rank_zero_warn",
    "seed_everything",
    "suggested_max_num_workers",
]
