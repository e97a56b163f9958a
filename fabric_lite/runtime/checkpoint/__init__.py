"""Checkpoints as functions over plain values (modules, optimizers, ranks, a filesystem), never a strategy: a strategy's
``save_checkpoint``/``load_checkpoint`` gathers those values and calls in. Nothing here imports
``torch.distributed.checkpoint`` or DeepSpeed at module level."""

from fabric_lite.runtime.checkpoint.entries import PRECISION_KEY, restore_entries
from fabric_lite.runtime.checkpoint.files import CheckpointError, atomic_save, safe_load
from fabric_lite.runtime.checkpoint.files import _torch_load as _torch_load  # for cloud_io and load
from fabric_lite.runtime.checkpoint.folders import on_rank_zero

__all__ = ["PRECISION_KEY", "CheckpointError", "atomic_save", "on_rank_zero", "restore_entries", "safe_load"]
