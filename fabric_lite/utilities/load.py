"""Reading checkpoints lazily and moving loaded state into objects (Lightning Fabric's private ``utilities.load``).

:func:`_lazy_load` maps the file and reads a tensor only when it is used, so converting a large checkpoint costs
the memory of the tensors in use; unlike Lightning's, it unpickles with ``weights_only=True`` by default.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch.utils._pytree import tree_map

from fabric_lite.runtime.checkpoint import CheckpointError, _torch_load
from fabric_lite.utilities.apply_func import apply_to_collection
from fabric_lite.utilities.types import _PATH, _Stateful

#: the file of a sharded checkpoint folder with the entries that are not tensors (Lightning's name)
_METADATA_FILENAME = "meta.pt"

# what a lazy tensor answers from its shape and dtype alone, without reading its bytes
_WITHOUT_READING = frozenset(
    {"dtype", "shape", "size", "ndim", "dim", "numel", "layout", "is_meta", "names", "requires_grad", "is_sparse"}
)


class _NotYetLoadedTensor:
    """A tensor of a file opened by :func:`_lazy_load`, read when first used.

    Its shape, dtype and size need no read; :meth:`_load_tensor`, a torch operation or another attribute gives the
    tensor. ``model.load_state_dict(lazy)`` reads each tensor as it copies it.
    """

    def __init__(self, tensor: torch.Tensor) -> None:
        self._tensor = tensor  # backed by the mapped file: its pages are read when touched

    @property
    def metatensor(self) -> torch.Tensor:
        """A meta-device tensor with this tensor's shape, strides and dtype."""
        return torch.empty_strided(self._tensor.shape, self._tensor.stride(), dtype=self._tensor.dtype, device="meta")

    @property
    def device(self) -> torch.device:
        """Where :meth:`_load_tensor` puts the tensor: the CPU."""
        return self._tensor.device

    def _load_tensor(self) -> torch.Tensor:
        """The tensor (a ``Parameter`` where one was saved), read from the file as its memory is used."""
        return self._tensor

    @classmethod
    def __torch_function__(
        cls,
        func: Callable[..., Any],
        types: Sequence[type],
        args: Sequence[Any] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        def load(value: Any) -> Any:
            return value._load_tensor() if isinstance(value, _NotYetLoadedTensor) else value

        return func(*tree_map(load, tuple(args)), **tree_map(load, kwargs or {}))

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name == "_tensor":
            raise AttributeError(name)
        return getattr(self._tensor if name in _WITHOUT_READING else self._load_tensor(), name)

    def __len__(self) -> int:
        return len(self._tensor)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(shape={tuple(self._tensor.shape)}, dtype={self._tensor.dtype})"


def _lazy_load(filename: _PATH, *, weights_only: bool = True) -> Any:
    """Open the ``torch.save`` file ``filename`` with every tensor a :class:`_NotYetLoadedTensor`; pass
    ``weights_only=False`` (unpickling any object) only for a file you trust.

    Raises:
        FileNotFoundError: ``filename`` is not a file.
        CheckpointError: the file is no ``torch.save`` zip file, is corrupt, or holds objects ``weights_only`` refuses.
    """
    if not os.path.isfile(filename):
        raise FileNotFoundError(f"Path {str(filename)!r} does not exist or is not a file.")
    loaded = _torch_load(filename, str(filename), weights_only, "cpu", mmap=True)
    return apply_to_collection(loaded, torch.Tensor, _NotYetLoadedTensor)


def _materialize_tensors(collection: Any) -> Any:
    """``collection`` with every :class:`_NotYetLoadedTensor` replaced by its tensor."""
    return apply_to_collection(collection, _NotYetLoadedTensor, lambda t: t._load_tensor())


def _move_state_into(source: dict[str, Any], destination: dict[str, Any], keys: set[str] | None = None) -> None:
    """Move the entries ``keys`` (default: all) of ``source`` into ``destination``, as ``fabric.load`` does: an object
    with ``load_state_dict`` loads its entry, anything else is replaced. Moved entries leave ``source``."""
    for key in set(source) if keys is None else keys & set(source):
        value = source.pop(key)
        if key in destination and isinstance(destination[key], _Stateful):
            destination[key].load_state_dict(value)
        else:
            destination[key] = value


def _load_distributed_checkpoint(checkpoint_folder: Path) -> dict[str, Any]:
    """Read a sharded (DCP) checkpoint folder into one full state dict in CPU memory, ``meta.pt`` entries included.

    Raises:
        CheckpointError: the folder is no sharded checkpoint, or reading it failed.
    """
    from fabric_lite.runtime.checkpoint.folders import check_sharded_checkpoint, read_entries

    checkpoint = read_entries(check_sharded_checkpoint(checkpoint_folder), None)
    extra = Path(checkpoint_folder) / _METADATA_FILENAME
    if extra.is_file():
        try:
            checkpoint.update(torch.load(extra, map_location="cpu", weights_only=True))
        except Exception as err:
            raise CheckpointError(f"Could not read {str(extra)!r}: {type(err).__name__}: {err}") from err
    return checkpoint
