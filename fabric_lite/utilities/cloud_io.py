"""The filesystem behind a path or URL (Lightning Fabric's ``utilities.cloud_io``), through the optional ``fsspec``.

Example::

    from fabric_lite.utilities.cloud_io import get_filesystem

    fs = get_filesystem("s3://bucket/checkpoints")  # needs fsspec and s3fs
    fs.exists("s3://bucket/checkpoints/last.ckpt")
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from fabric_lite.utilities.types import _PATH

if TYPE_CHECKING:
    from fsspec import AbstractFileSystem  # type: ignore[import-untyped,import-not-found,unused-ignore]


def get_filesystem(path: _PATH, **kwargs: Any) -> AbstractFileSystem:
    """The ``fsspec`` filesystem for ``path`` (a local path, ``file://``, ``s3://``, ``memory://``, ...).

    Args:
        path: a local path or a URL.
        **kwargs: passed to the filesystem's constructor (e.g. credentials).

    Raises:
        ImportError: ``fsspec`` is not installed; the message says how to install it.

    Example::

        fs = get_filesystem("/tmp/run")  # fsspec's LocalFileSystem
        fs.makedirs("/tmp/run", exist_ok=True)
    """
    try:
        from fsspec.core import url_to_fs  # type: ignore[import-untyped,import-not-found,unused-ignore]
    except ImportError as err:
        raise ImportError(
            f"get_filesystem({str(path)!r}) needs the fsspec package, which is not installed."
            " Install it with `pip install fsspec` (and e.g. s3fs or gcsfs for cloud URLs)."
        ) from err
    fs, _ = url_to_fs(str(path), **kwargs)
    return fs


def _is_local_file_protocol(path: _PATH) -> bool:
    """Whether ``path`` names a local file: its protocol (the part before the first ``::`` or ``://``, as fsspec
    reads it) is absent or ``file``. Decided without fsspec."""
    parts = re.split(r"(::|://)", str(path), maxsplit=1)
    return len(parts) == 1 or parts[0] == "file"


__all__ = ["get_filesystem"]
