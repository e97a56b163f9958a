"""Checkpoints, in functions over plain values (modules, optimizers, ranks, a filesystem), never a strategy: a
strategy's ``save_checkpoint``/``load_checkpoint`` gathers those values and calls in. :mod:`.files`: one file,
written atomically and read safely; :mod:`.entries`: a ``state`` dict as state dicts, and back; :mod:`.folders`:
``torch.distributed.checkpoint`` folders and the atomic publish of any checkpoint folder; :mod:`.sharded`: sharded
modules (FSDP, tensor parallel); :mod:`.deepspeed`: DeepSpeed's folders. :mod:`fabric_lite.utilities.consolidate`
turns a folder into one file. Nothing here imports ``torch.distributed.checkpoint`` or DeepSpeed at module level.
"""

from fabric_lite.runtime.checkpoint.entries import PRECISION_KEY, restore_entries
from fabric_lite.runtime.checkpoint.files import CheckpointError, atomic_save, safe_load
from fabric_lite.runtime.checkpoint.files import _torch_load as _torch_load  # for cloud_io and load
from fabric_lite.runtime.checkpoint.folders import on_rank_zero

__all__ = ["PRECISION_KEY", "CheckpointError", "atomic_save", "on_rank_zero", "restore_entries", "safe_load"]
