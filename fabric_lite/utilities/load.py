"""Reading checkpoints lazily and moving loaded state into objects: Lightning Fabric's private
``lightning_fabric.utilities.load`` names, which litgpt and other clients import.

* :func:`_lazy_load` opens a ``torch.save`` file without reading its tensors: each tensor is a
  :class:`_NotYetLoadedTensor` whose bytes are read when it is used (``torch.load(mmap=True)`` maps the file; no
  tensor data is read until a page is touched). Loading a 7B checkpoint to convert a few tensors at a time then
  costs the memory of those tensors, not of the file.
* :func:`_materialize_tensors` turns every lazy tensor of a collection into a tensor.
* :func:`_move_state_into` moves entries of a loaded checkpoint into a state dict (``load_state_dict`` for
  objects that have one), as ``fabric.load`` does.
* :func:`_load_distributed_checkpoint` reads a sharded (DCP) checkpoint folder into one full state dict.

Unlike Lightning's ``_lazy_load``, which unpickles whatever the file holds, the file is read with
``weights_only=True`` unless the caller passes ``weights_only=False`` for a file it trusts (as ``fabric.load``).
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
    """A tensor of a file opened by :func:`_lazy_load`, read when it is first used.

    Its shape, dtype and size are known without reading it; :meth:`_load_tensor` (or any torch operation, or an
    attribute such as ``.to``, ``.contiguous``, ``.data``) gives the tensor. ``model.load_state_dict(lazy)`` reads
    each tensor as it copies it.

    Example::

        checkpoint = _lazy_load("lit_model.pth")       # reads the file's index, no tensor data
        weight = checkpoint["transformer.wte.weight"]  # _NotYetLoadedTensor(shape=(32000, 4096), dtype=float16)
        weight.shape, weight.dtype                     # no read
        weight._load_tensor()                          # reads this tensor only
    """

    def __init__(self, tensor: torch.Tensor) -> None:
        self._tensor = tensor  # backed by the mapped file: its pages are read when touched

    @property
    def metatensor(self) -> torch.Tensor:
        """A tensor on the meta device with this tensor's shape, strides and dtype."""
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
        if name in _WITHOUT_READING:
            return getattr(self._tensor, name)
        return getattr(self._load_tensor(), name)

    def __len__(self) -> int:
        return len(self._tensor)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(shape={tuple(self._tensor.shape)}, dtype={self._tensor.dtype})"


def _lazy_load(filename: _PATH, *, weights_only: bool = True) -> Any:
    """Open the ``torch.save`` file ``filename`` without reading its tensors; each tensor becomes a
    :class:`_NotYetLoadedTensor` (see the module's docstring).

    Args:
        filename: a local file written by ``torch.save`` (the zip format, torch's default since 1.6).
        weights_only: ``True`` unpickles only tensors, primitive types and containers; pass ``False`` only for a
            file you trust (Lightning's ``_lazy_load`` always unpickles everything).

    Raises:
        FileNotFoundError: ``filename`` is not a file.
        CheckpointError: the file is not a ``torch.save`` zip file, is corrupt, or holds objects ``weights_only``
            refuses.

    Example::

        state = _lazy_load("checkpoints/lit_model.pth")
        model.load_state_dict(state)  # each tensor is read as it is copied
    """
    if not os.path.isfile(filename):
        raise FileNotFoundError(f"Path {str(filename)!r} does not exist or is not a file.")
    loaded = _torch_load(filename, str(filename), weights_only, "cpu", mmap=True)
    return apply_to_collection(loaded, torch.Tensor, _NotYetLoadedTensor)


def _materialize_tensors(collection: Any) -> Any:
    """``collection`` (e.g. what :func:`_lazy_load` returned) with every :class:`_NotYetLoadedTensor` replaced by its
    tensor."""
    return apply_to_collection(collection, _NotYetLoadedTensor, lambda t: t._load_tensor())


def _move_state_into(source: dict[str, Any], destination: dict[str, Any], keys: set[str] | None = None) -> None:
    """Move the entries ``keys`` (all with ``None``) of ``source`` into ``destination``: an object there with
    ``state_dict``/``load_state_dict`` loads the entry, anything else is replaced by it. Moved entries leave
    ``source``.

    Example::

        checkpoint = torch.load("last.ckpt", weights_only=True)
        state = {"model": model, "step": 0}
        _move_state_into(checkpoint, state)  # model.load_state_dict(...); state["step"] = checkpoint's step
    """
    for key in set(source) if keys is None else keys & set(source):
        value = source.pop(key)
        if key in destination and isinstance(destination[key], _Stateful):
            destination[key].load_state_dict(value)
        else:
            destination[key] = value


def _load_distributed_checkpoint(checkpoint_folder: Path) -> dict[str, Any]:
    """Read a sharded checkpoint folder (``torch.distributed.checkpoint``, as FSDP and ModelParallel save) into one
    full state dict in this process, with the entries of its ``meta.pt``. It must fit in CPU memory.

    Raises:
        CheckpointError: the folder is not a sharded checkpoint, or reading it failed.

    Example::

        state = _load_distributed_checkpoint(Path("checkpoints/step-1000"))  # {"model": {...}, "step": 1000, ...}
    """
    from fabric_lite.runtime.checkpoint.folders import check_sharded_checkpoint, read_entries

    folder = check_sharded_checkpoint(checkpoint_folder)
    checkpoint = read_entries(folder, None)
    extra = Path(checkpoint_folder) / _METADATA_FILENAME
    if extra.is_file():
        try:
            checkpoint.update(torch.load(extra, map_location="cpu", weights_only=True))
        except Exception as err:
            raise CheckpointError(f"Could not read {str(extra)!r}: {type(err).__name__}: {err}") from err
    return checkpoint
