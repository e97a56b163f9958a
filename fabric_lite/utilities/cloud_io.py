"""The filesystem behind a path or URL (Lightning Fabric's ``utilities.cloud_io``), through the optional ``fsspec``.

A path is local when it has no protocol (``checkpoints/last.ckpt``) or the ``file`` protocol
(``file:///data/last.ckpt``); anything else (``s3://``, ``gs://``, ``memory://``, ``simplecache::s3://``) is a URL
and goes through ``fsspec`` (``pip install 'fabric-lite[remote]'``, plus the protocol's own package: ``s3fs``,
``gcsfs``, ``adlfs``, ...). Telling the two apart never imports ``fsspec``: local paths keep their plain ``os`` code
path, and a URL whose protocol has no installed filesystem is refused, never written as a local folder named
``s3:``.

Example::

    from fabric_lite.utilities.cloud_io import get_filesystem

    fs = get_filesystem("s3://bucket/checkpoints")  # needs fsspec and s3fs
    fs.exists("s3://bucket/checkpoints/last.ckpt")
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
    """The ``fsspec`` filesystem for ``path`` (a local path, ``file://``, ``s3://``, ``memory://``, ...).

    Args:
        path: a local path or a URL.
        **kwargs: passed to the filesystem's constructor (e.g. credentials, ``endpoint_url``).

    Raises:
        ImportError: ``fsspec``, or the package of the URL's protocol (``s3fs`` for ``s3://``, ...), is not
            installed; the message says what to install.
        ValueError: ``fsspec`` knows no filesystem for the URL's protocol.

    Example::

        fs = get_filesystem("/tmp/run")  # fsspec's LocalFileSystem
        fs.makedirs("/tmp/run", exist_ok=True)
    """
    return _filesystem(path, kwargs)[0]


def _load(path_or_url: IO[bytes] | _PATH, map_location: Any = None, weights_only: bool | None = None) -> Any:
    """Load a ``torch.save`` checkpoint from a path, an fsspec URL or an open file (Lightning Fabric's private
    ``_load``, which clients import as ``pl_load``).

    Unlike Lightning's, ``weights_only=None`` means ``True`` (fabric_lite never unpickles arbitrary objects unless
    told to: pass ``weights_only=False`` for a file you trust), and errors name the path
    (:class:`~fabric_lite.runtime.checkpoint.CheckpointError`).

    Example::

        state = _load("s3://bucket/run/last.ckpt", map_location="cpu")
    """
    safe = True if weights_only is None else weights_only
    if not isinstance(path_or_url, (str, os.PathLike)):
        return _torch_load(path_or_url, repr(path_or_url), safe, map_location)
    return safe_load(path_or_url, weights_only=safe, map_location=map_location)


def _atomic_save(checkpoint: dict[str, Any], filepath: _PATH) -> None:
    """Save ``checkpoint`` so that ``filepath`` is either the old file or the complete new one (Lightning Fabric's
    private ``_atomic_save``; see :func:`~fabric_lite.runtime.checkpoint.atomic_save`)."""
    atomic_save(checkpoint, filepath)


def _is_dir(fs: AbstractFileSystem, path: str | Path, strict: bool = False) -> bool:
    """Whether ``path`` on ``fs`` is a folder. On an object store, which has no real folders, any path that is not
    a file counts as one unless ``strict`` (then only an existing prefix does)."""
    if _is_object_storage(fs):
        return bool(fs.isdir(path)) if strict else not fs.isfile(path)
    return bool(fs.isdir(path))


def _is_object_storage(fs: AbstractFileSystem) -> bool:
    """Whether ``fs`` is an object store (S3, GCS, Azure, ...), which has no real folders."""
    protocols = fs.protocol if isinstance(fs.protocol, (tuple, list)) else (fs.protocol,)
    return any(protocol in _OBJECT_STORES for protocol in protocols)


__all__ = ["get_filesystem"]
