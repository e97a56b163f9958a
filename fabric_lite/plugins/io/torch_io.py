"""The default checkpoint IO: ``torch.save`` written atomically, ``torch.load`` with ``weights_only=True``."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from typing_extensions import override

from fabric_lite.plugins.io.checkpoint_io import CheckpointIO
from fabric_lite.utilities.checkpoint import atomic_save, safe_load
from fabric_lite.utilities.types import _PATH


class TorchCheckpointIO(CheckpointIO):
    """Checkpoint files written with ``torch.save`` and read with ``torch.load``: what every strategy uses unless
    given another :class:`CheckpointIO`.

    Writes are atomic (:func:`fabric_lite.utilities.checkpoint.atomic_save`: the file at ``path`` is either the
    previous checkpoint or the complete new one) and reads unpickle only tensors and plain values unless
    ``weights_only=False`` is passed (:func:`fabric_lite.utilities.checkpoint.safe_load`).

    Example::

        io = TorchCheckpointIO()
        io.save_checkpoint({"step": 3, "weight": torch.ones(2)}, "out/state.ckpt")
        io.load_checkpoint("out/state.ckpt")  # {'step': 3, 'weight': tensor([1., 1.])}
        io.remove_checkpoint("out/state.ckpt")
    """

    @override
    def save_checkpoint(self, checkpoint: dict[str, Any], path: _PATH, storage_options: Any | None = None) -> None:
        """Write ``checkpoint`` to ``path`` atomically, creating missing parent folders.

        Raises:
            TypeError: ``storage_options`` is not ``None``: this plugin has no options; write a ``CheckpointIO`` of
                your own to use them.
            CheckpointError: the write failed; the previous file at ``path`` is unchanged.
        """
        if storage_options is not None:
            raise TypeError(
                f"{type(self).__name__}.save_checkpoint(..., storage_options={storage_options!r}) is not supported:"
                " torch.save takes no storage options. Pass storage_options=None, or implement a CheckpointIO of"
                " your own that defines what they mean."
            )
        atomic_save(checkpoint, path)

    @override
    def load_checkpoint(
        self, path: _PATH, map_location: Any | None = None, weights_only: bool | None = None
    ) -> dict[str, Any]:
        """Read the checkpoint at ``path``; tensors land on the CPU unless ``map_location`` says otherwise.

        ``weights_only=None`` means ``True``: only tensors and plain values are unpickled. Pass ``False`` only for
        files you trust.

        Raises:
            FileNotFoundError: there is no file at ``path``.
            CheckpointError: the file is empty, truncated, not a checkpoint, or refused by ``weights_only``.
        """
        loaded: dict[str, Any] = safe_load(
            path, weights_only=weights_only, map_location="cpu" if map_location is None else map_location
        )
        return loaded

    @override
    def remove_checkpoint(self, path: _PATH) -> None:
        """Delete the file (or folder) at ``path``; nothing happens when there is none."""
        target = Path(path)
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target)
        elif target.exists() or target.is_symlink():
            target.unlink()
