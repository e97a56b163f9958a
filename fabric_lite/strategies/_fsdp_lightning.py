"""Lightning's private names of ``lightning.fabric.strategies.fsdp``, with their meaning for the FSDP2 strategy."""

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
    """``FSDPStrategy``'s ``no_backward_sync`` (Lightning's name): FSDP2's gradient reduction off while the outermost
    block is open."""


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
    """Whether ``path`` is a folder holding a sharded checkpoint (DCP's ``.metadata`` or Lightning's ``meta.pt``)."""
    path = Path(path)
    return path.is_dir() and any(
        (path / name).is_file() for name in (folders.METADATA_FILE, folders.LIGHTNING_METADATA_FILE)
    )


@contextmanager
def _get_full_state_dict_context(
    module: Module, world_size: int, rank0_only: bool = True
) -> Generator[None, None, None]:
    """Inside the block, ``module.state_dict()`` returns the full state dict gathered onto the CPU (Lightning's
    name). Every rank must call ``state_dict()``; with ``rank0_only`` the others get an empty dict. ``world_size``
    is unused."""
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
