"""Checkpoint IO plugins: how a strategy writes, reads and removes checkpoint files."""

from fabric_lite.plugins.io.async_io import AsyncCheckpointIO
from fabric_lite.plugins.io.checkpoint_io import CheckpointIO
from fabric_lite.plugins.io.torch_io import TorchCheckpointIO
from fabric_lite.plugins.io.xla import XLACheckpointIO

__all__ = ["AsyncCheckpointIO", "CheckpointIO", "TorchCheckpointIO", "XLACheckpointIO"]
