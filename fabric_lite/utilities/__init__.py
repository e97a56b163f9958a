"""Utilities: collection helpers, seeding, data loading and checkpoint files."""

from fabric_lite.utilities._dcp import consolidate_checkpoint
from fabric_lite.utilities.apply_func import apply_to_collection, convert_to_tensors, move_data_to_device
from fabric_lite.utilities.checkpoint import CheckpointError
from fabric_lite.utilities.exceptions import MisconfigurationException
from fabric_lite.utilities.progress import ProgressBar, progress_bar
from fabric_lite.utilities.seed import RandomState, seed_everything

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
