"""The default checkpoint IO: ``torch.save`` written atomically, ``torch.load`` with ``weights_only=True``."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from typing_extensions import override

from fabric_lite.plugins.io.checkpoint_io import CheckpointIO
from fabric_lite.runtime.checkpoint import atomic_save, safe_load
from fabric_lite.utilities._fs import _filesystem, _is_remote, _local_path
from fabric_lite.utilities.types import _PATH


class TorchCheckpointIO(CheckpointIO):
    """Checkpoints through ``torch.save``/``torch.load``, every strategy's default: writes are atomic
    (:func:`fabric_lite.runtime.checkpoint.atomic_save`), and reads unpickle only tensors and plain values unless
    given ``weights_only=False`` (:func:`fabric_lite.runtime.checkpoint.safe_load`).

    Example::

        TorchCheckpointIO().save_checkpoint({"step": 3}, "out/state.ckpt")
    """

    @override
    def save_checkpoint(self, checkpoint: dict[str, Any], path: _PATH, storage_options: Any | None = None) -> None:
        """Write ``checkpoint`` to ``path`` atomically, creating missing folders; ``path`` may be an fsspec URL
        (``pip install 'fabric-lite[remote]'``), whose filesystem gets ``storage_options``.

        Raises:
            TypeError: ``storage_options`` given with a local path.
            ImportError: fsspec or the URL's protocol package is missing.
            CheckpointError: the write failed; the previous file at ``path`` is unchanged.
        """
        if storage_options is not None and not _is_remote(path):
            raise TypeError(
                f"{type(self).__name__}.save_checkpoint(..., storage_options={storage_options!r}) is not supported"
                f" for the local path {str(path)!r}: storage options are for fsspec URLs (s3://, gs://, ...). Pass"
                " storage_options=None, or implement a CheckpointIO of your own that defines what they mean."
            )
        atomic_save(checkpoint, path, storage_options)

    @override
    def load_checkpoint(
        self, path: _PATH, map_location: Any | None = None, weights_only: bool | None = None
    ) -> dict[str, Any]:
        """Read the checkpoint at ``path`` (or fsspec URL) onto the CPU unless ``map_location`` says otherwise;
        ``weights_only=None`` means ``True`` (pass ``False`` only for files you trust).

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
        """Delete the file or folder at ``path`` (or fsspec URL); nothing happens when there is none."""
        if _is_remote(path):
            fs, fs_path = _filesystem(path)
            if fs.exists(fs_path):
                fs.rm(fs_path, recursive=True)
            return
        target = Path(_local_path(path))
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target)
        elif target.exists() or target.is_symlink():
            target.unlink()
