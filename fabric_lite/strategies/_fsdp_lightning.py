"""Lightning Fabric's private names of its FSDP strategy module (``lightning.fabric.strategies.fsdp``), with their
meaning for fabric_lite's FSDP2 strategy; :mod:`fabric_lite.strategies.fsdp` imports them, at Lightning's path."""

from __future__ import annotations

from collections.abc import Generator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from torch.nn import Module

from fabric_lite.runtime.checkpoint import folders
from fabric_lite.strategies._backward_sync import _NestedSyncSwitch


class _FSDPBackwardSyncControl(_NestedSyncSwitch):
    """``FSDPStrategy``'s ``no_backward_sync`` (Lightning's name for it): FSDP2's gradient reduction switched off for
    every ``fully_shard`` unit of the sharded module while the outermost block for it is open (FSDP1's ``no_sync``
    in Lightning's)."""


def _check_sharded(module: Any, action: str, call: str) -> None:
    """Raise ``TypeError`` unless ``module`` is the root of a module sharded with ``fully_shard``."""
    from torch.distributed.fsdp import FSDPModule

    if not isinstance(module, FSDPModule):
        # the root must be sharded: FSDP2's counterpart of Lightning's check that it is wrapped in FSDP1's class
        raise TypeError(
            f"{action} is only possible if the module passed to `{call}` is sharded by it (`fully_shard`, where"
            f" Lightning's FSDP1 checks that it is wrapped in `FullyShardedDataParallel`). Got:"
            f" {type(module).__name__}. Set the module up with fabric.setup_module(model) first."
        )


def _is_sharded_checkpoint(path: Path) -> bool:
    """Whether ``path`` is a folder holding a sharded checkpoint (Lightning's name for the check): the
    ``.metadata`` file that ``torch.distributed.checkpoint`` writes last, or Lightning's ``meta.pt`` beside the
    shards (both libraries write both)."""
    path = Path(path)
    return path.is_dir() and any(
        (path / name).is_file() for name in (folders.METADATA_FILE, folders.LIGHTNING_METADATA_FILE)
    )


@contextmanager
def _get_full_state_dict_context(
    module: Module, world_size: int, rank0_only: bool = True
) -> Generator[None, None, None]:
    """Inside the block, ``module.state_dict()`` returns the full state dict, each sharded tensor gathered onto the
    CPU (Lightning's name for the context that FSDP1's ``FULL_STATE_DICT`` type gives). Gathering is collective:
    every rank calls ``state_dict()``; with ``rank0_only`` the other ranks get an empty dict, as under FSDP1.
    ``world_size`` is taken for Lightning's signature.

    Example::

        with _get_full_state_dict_context(model, fabric.world_size):
            state = model.state_dict()  # on rank 0: every parameter whole, on the CPU
    """
    from torch.distributed.tensor import DTensor

    def gather(_: Module, state_dict: dict[str, Any], prefix: str, local_metadata: Any) -> None:
        for key, value in list(state_dict.items()):
            if isinstance(value, DTensor):
                state_dict[key] = value.full_tensor().cpu()
            elif isinstance(value, torch.Tensor):
                state_dict[key] = value.cpu()
        if rank0_only and torch.distributed.is_initialized() and torch.distributed.get_rank() != 0:
            state_dict.clear()

    handle = module.register_state_dict_post_hook(gather)  # type: ignore[no-untyped-call]
    try:
        yield
    finally:
        handle.remove()
