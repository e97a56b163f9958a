"""The filesystem behind a path or URL (Lightning Fabric's ``utilities.cloud_io``).

A path without a protocol or with ``file://`` is local and never imports ``fsspec``; any other protocol needs
``fsspec`` and its package (``s3fs``, ...), and is refused without them, never written as a local folder ``s3:``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from fabric_lite.runtime.checkpoint import _torch_load, atomic_save, safe_load
from fabric_lite.utilities._fs import _OBJECT_STORES, _filesystem
from fabric_lite.utilities._fs import _is_local_file_protocol as _is_local_file_protocol  # Lightning's name here
from fabric_lite.utilities.types import _PATH

if TYPE_CHECKING:
    from fsspec import AbstractFileSystem  # type: ignore[import-untyped,import-not-found,unused-ignore]


def get_filesystem(path: _PATH, **kwargs: Any) -> AbstractFileSystem:
    """The ``fsspec`` filesystem for ``path`` (local or a URL); ``**kwargs`` go to its constructor.

    Raises:
        ImportError: ``fsspec`` or the protocol's package is missing; the message says what to install.
        ValueError: ``fsspec`` knows no filesystem for the protocol.

    Example::

        get_filesystem("/tmp/run").makedirs("/tmp/run", exist_ok=True)
    """
    return _filesystem(path, kwargs)[0]


def _load(path_or_url: IO[bytes] | _PATH, map_location: Any = None, weights_only: bool | None = None) -> Any:
    """Load a ``torch.save`` checkpoint from a path, URL or open file (Lightning's ``_load``, imported as ``pl_load``).

    Unlike Lightning's, ``weights_only=None`` means ``True`` (pass ``False`` for a file you trust), and errors name
    the path (:class:`~fabric_lite.runtime.checkpoint.CheckpointError`).
    """
    safe = True if weights_only is None else weights_only
    if not isinstance(path_or_url, (str, os.PathLike)):
        return _torch_load(path_or_url, repr(path_or_url), safe, map_location)
    return safe_load(path_or_url, weights_only=safe, map_location=map_location)


def _atomic_save(checkpoint: dict[str, Any], filepath: _PATH) -> None:
    """Lightning's ``_atomic_save``: :func:`~fabric_lite.runtime.checkpoint.atomic_save`."""
    atomic_save(checkpoint, filepath)


def _is_dir(fs: AbstractFileSystem, path: str | Path, strict: bool = False) -> bool:
    """Whether ``path`` is a folder; on an object store any non-file path is one, unless ``strict``."""
    if _is_object_storage(fs):
        return bool(fs.isdir(path)) if strict else not fs.isfile(path)
    return bool(fs.isdir(path))


def _is_object_storage(fs: AbstractFileSystem) -> bool:
    """Whether ``fs`` is an object store (S3, GCS, Azure, ...), which has no real folders."""
    protocols = fs.protocol if isinstance(fs.protocol, (tuple, list)) else (fs.protocol,)
    return any(protocol in _OBJECT_STORES for protocol in protocols)


__all__ = ["get_filesystem"]
