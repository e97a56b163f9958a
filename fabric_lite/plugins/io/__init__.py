"""Checkpoint IO plugins: how a strategy writes, reads and removes checkpoint files."""

from fabric_lite.plugins.io.checkpoint_io import CheckpointIO
from fabric_lite.plugins.io.torch_io import TorchCheckpointIO

__all__ = ["CheckpointIO", "TorchCheckpointIO"]
