"""Where a path leads: a local file, or a URL only ``fsspec`` opens; telling them apart never imports ``fsspec``."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from fabric_lite.utilities.types import _PATH

if TYPE_CHECKING:
    from fsspec import AbstractFileSystem  # type: ignore[import-untyped,import-not-found,unused-ignore]

#: protocols of object stores: no real folders (``makedirs`` would create a bucket), and an object appears whole
#: when its upload completes
_OBJECT_STORES = frozenset({"s3", "s3a", "gs", "gcs", "az", "abfs", "abfss", "adl", "oci", "oss", "r2"})


def _protocol(path: _PATH) -> str:
    """``path``'s protocol as fsspec reads it (before the first ``::`` or ``://``), ``"file"`` when there is none."""
    parts = re.split(r"(::|://)", str(path), maxsplit=1)
    return parts[0] if len(parts) > 1 else "file"


def _is_local_file_protocol(path: _PATH) -> bool:
    """Whether ``path`` names a local file: its protocol is absent or ``file``."""
    return _protocol(path) == "file"


def _is_remote(path: _PATH) -> bool:
    """Whether ``path`` is a URL that only ``fsspec`` can open."""
    return _protocol(path) != "file"


def _local_path(path: _PATH) -> str:
    """A local path or ``file://`` URL as a path ``open`` understands."""
    text = str(path)
    return text[len("file://") :] if text.startswith("file://") else text


def _is_object_store(url: _PATH) -> bool:
    """Whether ``url`` is on an object store (S3, GCS, Azure, ...)."""
    return _protocol(str(url).split("::")[-1]) in _OBJECT_STORES


def _filesystem(url: _PATH, storage_options: dict[str, Any] | None = None) -> tuple[AbstractFileSystem, str]:
    """The fsspec filesystem of ``url`` and the path on it; ``storage_options`` go to the filesystem's constructor.

    Raises:
        ImportError: fsspec or the protocol's package is missing; the message says what to install.
        ValueError: fsspec knows no filesystem for the protocol.
        TypeError: ``storage_options`` is not a dict.
    """
    if storage_options is not None and not isinstance(storage_options, dict):
        raise TypeError(
            f"storage_options={storage_options!r} for {str(url)!r} must be a dict of arguments for the fsspec"
            " filesystem (e.g. {'endpoint_url': 'http://127.0.0.1:9000'} for s3://), or None."
        )
    try:
        from fsspec.core import url_to_fs  # type: ignore[import-untyped,import-not-found,unused-ignore]
    except ImportError as err:
        raise ImportError(
            f"{str(url)!r} needs the fsspec package, which is not installed. Install it with `pip install fsspec`"
            " (or `pip install 'fabric-lite[remote]'`), plus the package of the URL's protocol (s3fs for s3://,"
            " gcsfs for gs://, adlfs for az://)."
        ) from err
    try:
        fs, fs_path = url_to_fs(str(url), **(storage_options or {}))
    except ImportError as err:
        raise ImportError(f"{str(url)!r} cannot be opened: {err}. {_install_hint(url)}") from err
    except ValueError as err:
        if "protocol not known" not in str(err).lower():
            raise
        from fsspec.registry import known_implementations  # type: ignore[import-untyped,import-not-found,unused-ignore]

        raise ValueError(
            f"{str(url)!r} cannot be opened: fsspec knows no filesystem for the protocol {_protocol(url)!r}. Known"
            f" protocols include {', '.join(sorted(p for p in known_implementations if len(p) <= 5)[:20])}, ...;"
            " pass a local path or a URL with one of them."
        ) from err
    # fsspec reuses one filesystem object per process, with the folder listings it has seen (s3fs, gcsfs, ...);
    # another rank may have written since, and a stale listing would make ranks disagree on what exists
    fs.invalidate_cache()
    return fs, fs_path


def _install_hint(url: _PATH) -> str:
    """``Install it with `pip install s3fs`.`` for the first protocol of ``url`` whose package is missing."""
    from fsspec.registry import known_implementations  # type: ignore[import-untyped,import-not-found,unused-ignore]

    for protocol in str(url).split("::"):
        entry = known_implementations.get(_protocol(protocol if "://" in protocol else protocol + "://"))
        if entry is not None and not entry["class"].startswith("fsspec."):
            package = entry["class"].split(".", 1)[0]
            try:
                __import__(package)
            except ImportError:
                return f"Install it with `pip install {package}`."
    return "Install the package that the message names."
