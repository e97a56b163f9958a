"""Writing and reading checkpoint files safely, at local paths or fsspec URLs (``file://`` URLs are local paths).

:func:`atomic_save` leaves either the previous file or the complete new one; :func:`safe_load` reads with
``weights_only=True`` unless the caller opts out, and turns torch's terse errors into ones that name the path. At a URL
the checkpoint is serialised in memory and written in one call: an object store publishes the upload only when it
completes; on other fsspec filesystems whether a reader can see a partial file depends on the filesystem.
"""

from __future__ import annotations

import contextlib
import io
import os
import pickle
import shutil
import socket
import tempfile
from pathlib import Path
from typing import Any

import torch

from fabric_lite.utilities._fs import _filesystem, _is_object_store, _is_remote, _local_path
from fabric_lite.utilities.types import _PATH


class CheckpointError(RuntimeError):
    """A checkpoint could not be written or read; the message names the path.

    Example::

        try:
            fabric.load("checkpoints/last.ckpt", state)
        except CheckpointError as err:  # empty, truncated, not a checkpoint, or refused by weights_only=True
            print(err)
    """


def atomic_save(checkpoint: Any, path: _PATH, storage_options: dict[str, Any] | None = None) -> None:
    """Save ``checkpoint`` with ``torch.save`` so that ``path`` holds either the previous file or the complete new one,
    creating missing folders; the temporary file of a process killed mid-write is removed by the next save to ``path``.
    ``path`` may be an fsspec URL, with ``storage_options`` for its filesystem. Raises :class:`CheckpointError` (the
    original error as its cause) when anything fails."""
    if _is_remote(path):
        _save_to_url(checkpoint, str(path), storage_options)
        return
    target = Path(_local_path(path))
    folder = target.parent
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise CheckpointError(
            f"Cannot save the checkpoint to {str(target)!r}: cannot create its folder ({err})."
        ) from err
    tmp_name: str | None = None
    _remove_stale_temps(folder, target.name)
    try:
        fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.{_host()}.{os.getpid()}.", suffix=".tmp", dir=folder)
        os.fchmod(fd, _file_mode(target))  # mkstemp makes 0600; give the file the mode a plain open() would
        with os.fdopen(fd, "wb") as f:
            torch.save(checkpoint, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp_name, target)
        tmp_name = None
        _fsync_folder(folder)
    except BaseException as err:
        if tmp_name is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp_name)
        if isinstance(err, Exception):
            raise CheckpointError(
                f"Saving the checkpoint to {str(target)!r} failed: {type(err).__name__}: {err}. The previous file"
                " at that path, if any, is unchanged."
            ) from err
        raise


def _save_to_url(checkpoint: Any, url: str, storage_options: dict[str, Any] | None) -> None:
    fs, fs_path = _filesystem(url, storage_options)  # a missing package or unknown protocol: before any work
    try:
        buffer = io.BytesIO()
        torch.save(checkpoint, buffer)
        if not _is_object_store(url):  # on an object store, makedirs of a missing bucket would create one
            fs.makedirs(fs._parent(fs_path), exist_ok=True)
        # the complete bytes in one call: a single PUT, or a multipart upload (parallel parts on S3 and GCS)
        # published only once it completes
        fs.pipe(fs_path, buffer.getvalue())
    except Exception as err:
        raise CheckpointError(
            f"Saving the checkpoint to {url!r} failed: {type(err).__name__}: {err}. The previous object at that URL,"
            " if any, is unchanged."
        ) from err


def _host() -> str:
    return socket.gethostname().replace(".", "-") or "localhost"


def _remove_stale_temps(folder: Path, name: str) -> None:
    """Delete the temporary files and folders of saves to ``folder/name`` left by processes of this host that no longer
    exist (killed by SIGKILL, which no code can clean up after)."""
    prefix = f".{name}.{_host()}."
    try:
        candidates = [entry for entry in os.scandir(folder) if entry.name.startswith(prefix)]
    except OSError:
        return
    for entry in candidates:
        pid_text = entry.name[len(prefix) :].split(".", 1)[0]
        if not entry.name.endswith(".tmp") or not pid_text.isdigit() or _alive(int(pid_text)):
            continue
        if entry.is_dir(follow_symlinks=False):  # a checkpoint folder's (folders.temp_folder_beside)
            shutil.rmtree(entry.path, ignore_errors=True)
            continue
        with contextlib.suppress(OSError):
            os.unlink(entry.path)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _file_mode(target: Path) -> int:
    """The existing file's mode, or 0666 minus the umask (read from /proc, without changing the umask)."""
    try:
        return target.stat().st_mode & 0o777
    except OSError:
        pass
    umask = 0o022
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                umask = int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    return 0o666 & ~umask


def _fsync_folder(folder: Path) -> None:
    # makes the rename itself durable; not every platform/filesystem allows opening a folder
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def safe_load(path: _PATH, weights_only: bool | None = True, map_location: Any = "cpu") -> Any:
    """Load a checkpoint written by :func:`atomic_save` or ``torch.save`` onto ``map_location`` (the CPU by default).

    ``weights_only=True`` (or ``None``) unpickles only tensors, primitive types and containers, so a file cannot run
    code; pass ``False`` only for files you trust. Raises ``FileNotFoundError`` when there is no file at ``path`` (a
    path or an fsspec URL), :class:`CheckpointError` when it is empty, truncated, not a checkpoint, or refused by
    ``weights_only``.
    """
    safe = True if weights_only is None else weights_only
    if _is_remote(path):
        return _load_from_url(str(path), safe, map_location)
    target = Path(_local_path(path))
    if not target.is_file():
        if target.is_dir():
            raise CheckpointError(f"Cannot load {str(target)!r}: it is a folder, not a checkpoint file.")
        raise FileNotFoundError(f"Checkpoint file not found: {str(target)!r}.")
    if target.stat().st_size == 0:
        raise CheckpointError(f"The checkpoint {str(target)!r} is empty (0 bytes): it is incomplete or corrupt.")
    return _torch_load(target, str(target), safe, map_location)


def _load_from_url(url: str, safe: bool, map_location: Any) -> Any:
    fs, fs_path = _filesystem(url)
    try:
        info = fs.info(fs_path)
    except FileNotFoundError:
        raise FileNotFoundError(f"Checkpoint file not found: {url!r}.") from None
    if info.get("type") == "directory":
        raise CheckpointError(f"Cannot load {url!r}: it is a folder, not a checkpoint file.")
    if info.get("size") == 0:
        raise CheckpointError(f"The checkpoint {url!r} is empty (0 bytes): it is incomplete or corrupt.")
    with fs.open(fs_path, "rb") as f:
        return _torch_load(f, url, safe, map_location)


def _torch_load(source: Any, name: str, safe: bool, map_location: Any, mmap: bool = False) -> Any:
    """``torch.load`` with its terse errors for truncated or foreign files turned into errors naming ``name``
    (``mmap=True``: the tensors stay in the mapped file until they are used)."""
    try:
        return torch.load(source, map_location=map_location, weights_only=safe, mmap=mmap)
    except pickle.UnpicklingError as err:
        # torch names the class it refused ("Unsupported global: GLOBAL os.system ..."); any other unpickling
        # error means the bytes are not a checkpoint at all
        if safe and "global" in str(err).lower():
            raise CheckpointError(
                f"Refused to load {name!r} with weights_only=True: it contains Python objects other than"
                " tensors and plain values, and unpickling them could run code from the file. If, and only if, you"
                " trust where the file came from, load it with weights_only=False."
                f" (torch said: {_first_line(err)})"
            ) from err
        raise _corrupt(name, err) from err
    except FileNotFoundError:
        raise
    except Exception as err:
        raise _corrupt(name, err) from err


def _first_line(err: BaseException) -> str:
    lines = [line for line in str(err).splitlines() if line.strip()]
    return next((line for line in lines if "global" in line.lower()), lines[0] if lines else type(err).__name__)


def _corrupt(target: Path | str, err: BaseException) -> CheckpointError:
    detail = f"{type(err).__name__}: {_first_line(err)}" if str(err) else type(err).__name__
    return CheckpointError(f"The checkpoint {str(target)!r} is incomplete or corrupt and cannot be loaded ({detail}).")
