"""Checkpoint folders: recognising, publishing and reading the folders ``torch.distributed.checkpoint`` (DCP) writes.

A sharded checkpoint holds one ``.distcp`` file per rank and ``.metadata``, written last; fabric_lite adds
``fabric_lite.json``, naming the entries that are modules and optimizers. Every checkpoint folder, DCP's or DeepSpeed's,
is written beside the target and swapped into place (:func:`save_folder`), so a failed save leaves the previous
checkpoint. A :data:`Folder` may be an fsspec URL.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import io
import json
import os
import shutil
import tempfile
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from fabric_lite.runtime.checkpoint.files import (
    CheckpointError,
    _file_mode,
    _first_line,
    _fsync_folder,
    _host,
    _remove_stale_temps,
    safe_load,
)
from fabric_lite.utilities._fs import _filesystem, _is_object_store, _is_remote, _local_path
from fabric_lite.utilities.types import _PATH

#: the file DCP writes last, once every rank's shards are complete: a folder holding it is a sharded checkpoint
METADATA_FILE = ".metadata"
#: fabric_lite's own index of a sharded checkpoint: which top-level entries are modules and optimizers
INDEX_FILE = "fabric_lite.json"
#: where Lightning Fabric's FSDP and model-parallel strategies keep the entries that are not modules or optimizers
LIGHTNING_METADATA_FILE = "meta.pt"


#: a checkpoint folder: a local ``Path``, or an fsspec URL (``s3://bucket/run/step-100``) as a ``str``
Folder = Path | str


def _folder(path: _PATH) -> Folder:
    """``path`` as a :data:`Folder`: a URL stays a string (without a trailing ``/``), a local path or ``file://``
    URL becomes a ``Path``."""
    if not _is_remote(path):
        return Path(_local_path(path))
    url = str(path)
    return url if url.endswith("://") else url.rstrip("/")


def _join(url: str, name: str) -> str:
    return f"{url.rstrip('/')}/{name}"


def is_sharded_checkpoint(path: _PATH, storage_options: dict[str, Any] | None = None) -> bool:
    """Whether ``path`` (a folder or an fsspec URL) is a sharded checkpoint: it holds DCP's ``.metadata``.

    Example::

        is_sharded_checkpoint("checkpoints/step-100")  # True for what fabric.save wrote with FSDPStrategy()
    """
    return _has_file(_folder(path), METADATA_FILE, storage_options)


def _has_file(folder: Folder, name: str, storage_options: dict[str, Any] | None = None) -> bool:
    if isinstance(folder, str):
        fs, fs_path = _filesystem(folder, storage_options)
        return bool(fs.isfile(_join(fs_path, name)))
    return (folder / name).is_file()


def check_sharded_checkpoint(path: _PATH) -> Folder:
    """``path`` as a :data:`Folder` (a URL stays a string) if it is a sharded checkpoint folder; else
    ``FileNotFoundError`` when nothing is there, or :class:`CheckpointError` saying what it is instead."""
    folder = _folder(path)
    if is_sharded_checkpoint(folder):
        return folder
    if isinstance(folder, str):
        fs, fs_path = _filesystem(folder)
        is_file, is_dir = fs.isfile(fs_path), fs.isdir(fs_path)
        name, parent = folder.rsplit("/", 1)[-1], folder.rsplit("/", 1)[0]
        found = sorted(entry.rstrip("/").rsplit("/", 1)[-1] for entry in fs.ls(fs_path, detail=False)) if is_dir else []
    else:
        is_file, is_dir = folder.is_file(), folder.is_dir()
        name, parent = folder.name, str(folder.parent)
        found = sorted(p.name for p in folder.iterdir()) if is_dir else []
    if is_file:
        if name == METADATA_FILE or name.endswith(".distcp"):
            raise CheckpointError(
                f"{str(folder)!r} is one file of a sharded checkpoint, not the checkpoint: pass its folder {parent!r}."
            )
        raise CheckpointError(
            f"{str(folder)!r} is a file (a full checkpoint, e.g. from torch.save or a non-FSDP strategy), not a sharded"
            " checkpoint folder written by torch.distributed.checkpoint. Load it with fabric.load (which reads full"
            " files too), or pass the folder that fabric.save wrote with FSDPStrategy(state_dict_type='sharded')."
        )
    if is_dir:
        shown = ", ".join(found[:5]) + (", ..." if len(found) > 5 else "") if found else "nothing"
        raise CheckpointError(
            f"The folder {str(folder)!r} is not a sharded checkpoint: torch.distributed.checkpoint writes a"
            f" {METADATA_FILE!r} file into every checkpoint folder, and this one holds {shown}. Pass the folder that"
            " fabric.save wrote with FSDPStrategy(), or the path of a checkpoint file."
        )
    raise FileNotFoundError(f"Checkpoint not found: {str(folder)!r}.")


def make_temp_folder(target: _PATH, storage_options: dict[str, Any] | None = None) -> Folder:
    """A new, empty folder beside ``target`` (``.<name>.<random>.tmp``) with a plain ``mkdir``'s mode; for a URL only
    its name (DCP's writer creates what the store needs). Raises :class:`CheckpointError` when ``target`` is a folder
    that is not a sharded checkpoint (replacing it would delete its contents), or the folder cannot be created."""
    folder = _folder(target)
    if isinstance(folder, str):
        return planned_temp_folder(folder, uuid.uuid4().hex, storage_options)
    return temp_folder_beside(folder, "sharded", is_sharded_checkpoint)


def planned_temp_folder(
    target: _PATH, tag: str, storage_options: dict[str, Any] | None = None, *, sweep: bool = False
) -> Folder:
    """The temporary folder of a background save beside ``target`` (``.<name>.<tag>.tmp``, ``tag`` the same on every
    rank), checked as :func:`make_temp_folder` does but not created: DCP's writer creates it on every rank, so no
    collective is needed. ``sweep`` (rank 0): first remove what killed writers of this host left."""
    folder = _folder(target)
    if isinstance(folder, str):
        _check_url_target(folder, storage_options)
        parent, name = folder.rsplit("/", 1)
        return f"{parent}/.{name}.{tag}.tmp"
    _refuse_other_folder(folder, "sharded", is_sharded_checkpoint)
    if sweep:
        _remove_stale_temps(folder.parent, folder.name)
    return folder.parent / f".{folder.name}.{tag}.tmp"


def temp_tag() -> str:
    """The tag of this process's background saves' temporary folders: its host and pid (read by the sweep of killed
    writers), then a random part."""
    return f"{_host()}.{os.getpid()}.{uuid.uuid4().hex[:8]}"


def _check_url_target(folder: str, storage_options: dict[str, Any] | None) -> None:
    fs, fs_path = _filesystem(folder, storage_options)
    if not fs_path.strip("/") or (_is_object_store(folder) and "/" not in fs_path.strip("/")):
        raise CheckpointError(
            f"Cannot save a sharded checkpoint to {folder!r}: it names a bucket (or a filesystem root), and a"
            f" checkpoint is a folder inside one. Pass a URL with a folder name, such as {_join(folder, 'step-100')!r}."
        )
    if fs.isdir(fs_path) and not is_sharded_checkpoint(folder, storage_options):
        raise CheckpointError(
            f"Cannot save a sharded checkpoint to {folder!r}: a folder that is not a checkpoint exists there,"
            " and saving would replace it and everything in it. Choose another URL, or remove the folder first."
        )


def _refuse_other_folder(target: Path, kind: str, is_checkpoint: Callable[[Path], bool]) -> None:
    if target.is_dir() and not is_checkpoint(target):
        raise CheckpointError(
            f"Cannot save a {kind} checkpoint to {str(target)!r}: a folder that is not a {kind} checkpoint exists"
            " there, and saving would replace it and everything in it. Choose another path, or remove the folder first."
        )


def temp_folder_beside(target: Path, kind: str, is_checkpoint: Callable[[Path], bool]) -> Path:
    """A new, empty local folder beside ``target`` (``.<name>.<host>.<pid>.<random>.tmp``), after removing those of
    killed saves; :class:`CheckpointError` where ``target`` is a folder but not a ``kind`` checkpoint, or the folder
    cannot be created."""
    _refuse_other_folder(target, kind, is_checkpoint)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        # named after this host and process, so that the next save removes it if this process is killed mid-write
        _remove_stale_temps(target.parent, target.name)
        prefix = f".{target.name}.{_host()}.{os.getpid()}."
        temp = Path(tempfile.mkdtemp(prefix=prefix, suffix=".tmp", dir=target.parent))
        file_mode = _file_mode(target.parent / f".{target.name}.mode-probe")
        os.chmod(temp, file_mode | ((file_mode & 0o444) >> 2))  # rw for the file mode, x where it is readable
    except OSError as err:
        raise CheckpointError(f"Cannot save the checkpoint to {str(target)!r}: {err}.") from err
    return temp


def writer(folder: Folder, storage_options: dict[str, Any] | None = None) -> Any:
    """DCP's storage writer for ``folder``: files synced to disk locally; through fsspec for a URL (an object
    appears whole when its upload completes, so there is nothing to sync)."""
    if isinstance(folder, str):
        from torch.distributed.checkpoint._fsspec_filesystem import FsspecWriter

        return FsspecWriter(folder, sync_files=False, **(storage_options or {}))
    from torch.distributed.checkpoint.filesystem import FileSystemWriter

    return FileSystemWriter(str(folder), sync_files=True)


def reader(folder: Folder) -> Any:
    """DCP's storage reader for ``folder`` (a local folder, or a URL through fsspec)."""
    if isinstance(folder, str):
        from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader

        return FsspecReader(folder)
    from torch.distributed.checkpoint.filesystem import FileSystemReader

    return FileSystemReader(str(folder))


def write_index(folder: Folder, **index: str | list[str] | dict[str, str] | None) -> None:
    """Write fabric_lite's index of the checkpoint in ``folder`` (:data:`INDEX_FILE`): ``index``, in format 1. A
    sharded checkpoint's names the top-level entries that are ``modules`` and ``optimizers``."""
    write_file(folder, INDEX_FILE, json.dumps({"format": 1, **index}).encode())


def write_file(folder: Folder, name: str, data: bytes) -> None:
    """Write ``data`` as the file ``name`` of ``folder``, synced to disk (one upload for a URL)."""
    if isinstance(folder, str):
        fs, fs_path = _filesystem(folder)
        fs.pipe_file(_join(fs_path, name), data)
        return
    with open(folder / name, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def read_json(folder: Folder, name: str) -> dict[str, Any] | None:
    """The JSON object in the file ``name`` of ``folder``; ``None`` where there is none (no file, or no object)."""
    try:
        if isinstance(folder, str):
            fs, fs_path = _filesystem(folder)
            value = json.loads(fs.cat_file(_join(fs_path, name)))
        else:
            value = json.loads((folder / name).read_text())
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def write_lightning_metadata(folder: Folder, metadata: dict[str, Any]) -> None:
    """Write ``metadata`` (the entries that are neither modules nor optimizers) as :data:`LIGHTNING_METADATA_FILE`,
    where Lightning Fabric's sharded strategies look for them."""
    buffer = io.BytesIO()
    torch.save(metadata, buffer)
    write_file(folder, LIGHTNING_METADATA_FILE, buffer.getvalue())


def read_lightning_metadata(folder: Folder) -> dict[str, Any]:
    """The entries in :data:`LIGHTNING_METADATA_FILE` (``{}`` without one), read with ``weights_only=True``."""
    if not _has_file(folder, LIGHTNING_METADATA_FILE):
        return {}
    loaded = safe_load(
        _join(folder, LIGHTNING_METADATA_FILE) if isinstance(folder, str) else folder / LIGHTNING_METADATA_FILE
    )
    return dict(loaded) if isinstance(loaded, dict) else {}


def on_rank_zero(fn: Callable[[], Any], rank: int, world_size: int, broadcast: Callable[..., Any]) -> Any:
    """Run ``fn`` on global rank 0 and return its result on every rank, through ``broadcast(value, src=0)``; if it
    raises, rank 0 raises its error and every other rank a :class:`CheckpointError` quoting it.

    Example::

        ranks = (strategy.global_rank, strategy.world_size, strategy.broadcast)
        temp = on_rank_zero(lambda: make_temp_folder(target), *ranks)
    """
    import torch.distributed as dist

    outcome: tuple[bool, Any] = (True, None)
    error: Exception | None = None
    if rank == 0:
        try:
            outcome = (True, fn())
        except Exception as err:
            error, outcome = err, (False, f"{type(err).__name__}: {err}")
    if dist.is_initialized() and world_size > 1:
        outcome = broadcast(outcome, src=0)
    if error is not None:
        raise error
    if not outcome[0]:
        raise CheckpointError(f"Rank 0 failed to save the checkpoint: {outcome[1]}")
    return outcome[1]


def save_folder(
    target: Folder,
    kind: str,
    make_temp: Callable[[], Folder],
    write: Callable[[Folder], str | None],
    finish: Callable[[Folder], None],
    ranks: tuple[int, int, Callable[..., Any]],
    storage_options: dict[str, Any] | None = None,
) -> None:
    """Write a checkpoint folder at ``target`` atomically; every rank calls it. Rank 0 makes a temporary folder
    (``make_temp``), every rank writes its part (``write`` returns ``None`` or what failed), and rank 0 completes it
    (``finish``) and swaps it into place (:func:`publish_folder`), or deletes it and every rank raises
    :class:`CheckpointError`. ``ranks``: ``(global_rank, world_size, broadcast)``.

    Example::

        save_folder(Path("ckpt"), "sharded", lambda: make_temp_folder("ckpt"), write, finish, ranks)
    """
    temp = _folder(on_rank_zero(lambda: str(make_temp()), *ranks))
    publish_written(target, kind, temp, write(temp), finish, ranks, storage_options)


def publish_written(
    target: Folder,
    kind: str,
    temp: Folder,
    error: str | None,
    finish: Callable[[Folder], None],
    ranks: tuple[int, int, Callable[..., Any]],
    storage_options: dict[str, Any] | None = None,
    group: Any | None = None,
) -> None:
    """The second half of :func:`save_folder`, once every rank has written into ``temp`` (``error``: this rank's
    failure, or ``None``). ``group``: the process group of the agreement, which ``ranks``' ``broadcast`` uses too
    (``None``: the default group); a background save passes its own."""
    import torch.distributed as dist

    world_size = ranks[1]
    errors: list[str | None] = [error]
    if dist.is_initialized() and world_size > 1:
        errors = [None] * world_size
        dist.all_gather_object(errors, error, group=group)
    failed = sorted({e for e in errors if e is not None})

    def publish() -> None:
        if failed:
            remove(temp, storage_options)
            raise CheckpointError(
                f"Saving the {kind} checkpoint to {str(target)!r} failed ({'; '.join(failed)}). The previous"
                " checkpoint at that path, if any, is unchanged."
            )
        try:
            finish(temp)
        except BaseException:
            remove(temp, storage_options)
            raise
        publish_folder(temp, target, storage_options)  # deletes temp, or says where it is kept and why

    on_rank_zero(publish, *ranks)


def publish_folder(temp: Folder, target: _PATH, storage_options: dict[str, Any] | None = None) -> None:
    """Put the complete checkpoint folder ``temp`` at ``target``, replacing what was there. Locally the previous
    checkpoint goes only once the new one is in place (exchanged in one step on Linux, else renamed aside first); a
    :class:`CheckpointError` then leaves it at ``target``. A URL has no folder rename: the previous ``.metadata`` is
    deleted first and the new one copied last, so a reader never takes a mix for a checkpoint, and a failed copy leaves
    the new one at ``temp``."""
    if isinstance(temp, str):
        _publish_url(temp, str(_folder(target)), storage_options)
        return
    target = Path(_local_path(target))
    previous: Path | None = None
    try:
        if (target.exists() or target.is_symlink()) and _exchange(Path(temp), target):
            _fsync_folder(target.parent)
            remove(temp)  # the previous checkpoint, now at the temporary name
            return
        if target.exists() or target.is_symlink():  # no exchange here: two renames, the previous one set aside
            previous = target.parent / f".{target.name}.{uuid.uuid4().hex}.old"
            os.replace(target, previous)
        try:
            os.replace(temp, target)
        except OSError:
            if previous is not None:
                os.replace(previous, target)  # put the previous checkpoint back
                previous = None
            raise
        _fsync_folder(target.parent)
    except OSError as err:
        remove(temp)
        raise CheckpointError(
            f"Saving the checkpoint to {str(target)!r} failed: {type(err).__name__}: {err}. The previous checkpoint at"
            " that path, if any, is unchanged."
        ) from err
    if previous is not None:
        remove(previous)


_AT_FDCWD, _RENAME_EXCHANGE = -100, 2


def _exchange(a: Path, b: Path) -> bool:
    """Swap ``a`` and ``b`` in one step (``renameat2(RENAME_EXCHANGE)``); ``False``, with nothing changed, where the
    system or file system cannot. Raises ``OSError`` when the exchange fails otherwise."""
    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (AttributeError, OSError):  # not Linux, or a C library older than glibc 2.28
        return False
    if renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):
        return False
    raise OSError(code, os.strerror(code), str(b))


def _publish_url(temp: str, target: str, storage_options: dict[str, Any] | None) -> None:
    fs, temp_path = _filesystem(temp, storage_options)
    target_path = _filesystem(target, storage_options)[1]
    temp_path, target_path = temp_path.rstrip("/"), target_path.rstrip("/")
    try:
        files = sorted(fs.find(temp_path), key=lambda name: name.endswith("/" + METADATA_FILE))  # .metadata last
        if fs.exists(target_path):
            if fs.isfile(_join(target_path, METADATA_FILE)):
                fs.rm_file(_join(target_path, METADATA_FILE))  # from here on, no reader takes it for a checkpoint
            fs.rm(target_path, recursive=True)
        for name in files:
            fs.copy(name, target_path + name[len(temp_path) :])
    except Exception as err:
        raise CheckpointError(
            f"Saving the checkpoint to {target!r} failed while copying it into place: {type(err).__name__}: {err}."
            f" The complete new checkpoint is at {temp!r}; {target!r} holds no complete checkpoint (its .metadata is"
            " written last)."
        ) from err
    remove(temp, storage_options)


def remove(path: Folder, storage_options: dict[str, Any] | None = None) -> None:
    """Delete a file or folder (local, or a URL), ignoring what is already gone."""
    if isinstance(path, str):
        fs, fs_path = _filesystem(path, storage_options)
        with contextlib.suppress(FileNotFoundError):
            fs.rm(fs_path, recursive=True)
        return
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(OSError):
            path.unlink()


def read_metadata(folder: Folder) -> Any:
    """The checkpoint's DCP ``Metadata``; a :class:`CheckpointError` naming the folder when it is unreadable."""
    try:
        return reader(folder).read_metadata()
    except dcp_errors() as err:
        raise CheckpointError(
            f"The sharded checkpoint {str(folder)!r} is incomplete or corrupt: its {METADATA_FILE} cannot be read"
            f" ({describe(err)})."
        ) from err


def _key_paths(metadata: Any) -> Iterator[tuple[str, Any]]:
    """Each flat key of a checkpoint's DCP metadata with its path in the saved state dict (``None`` if unknown)."""
    planner_data = metadata.planner_data or {}
    return ((flat_key, planner_data.get(flat_key)) for flat_key in metadata.state_dict_metadata)


def top_level_keys(metadata: Any) -> list[str]:
    """The top-level entries of a checkpoint (``"model"``, ``"step"``, ...) from its DCP metadata."""
    return list(dict.fromkeys(str(path[0]) if path else flat_key for flat_key, path in _key_paths(metadata)))


def entry_keys(metadata: Any, entry: str) -> set[str]:
    """The keys of top-level entry ``entry`` (e.g. a module's parameter names) in a checkpoint's DCP metadata."""
    return {str(path[1]) for _, path in _key_paths(metadata) if path and str(path[0]) == entry and len(path) > 1}


def read_entries(folder: Folder, keys: list[str] | None) -> dict[str, Any]:
    """The top-level entries ``keys`` (all of them for ``None``) read whole into this process: tensors unsharded on the
    CPU, other values as saved (unpickled by DCP with ``weights_only=True``). No collective, so it suits small entries,
    or one process consolidating."""
    # torch's own dcp_to_torch_save pairs these two private helpers to rebuild a state dict from the metadata alone;
    # the public ``dcp.load`` cannot do that (it fills the entries of a state dict you already have)
    from torch.distributed.checkpoint.default_planner import _EmptyStateDictLoadPlanner
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

    state: dict[str, Any] = {}
    if keys is not None and not keys:
        return state
    try:
        _load_state_dict(
            state,
            storage_reader=reader(folder),
            planner=_EmptyStateDictLoadPlanner(keys=keys),  # type: ignore[no-untyped-call]
            no_dist=True,
        )
    except dcp_errors() as err:
        raise CheckpointError(
            f"Reading {keys if keys is not None else 'every entry'} from the sharded checkpoint {str(folder)!r}"
            f" failed: {describe(err)}"
        ) from err
    return state


def dcp_errors() -> tuple[type[BaseException], ...]:
    """What a DCP call raises on failure: ``Exception``, and DCP's ``CheckpointException`` (a ``BaseException``,
    raised on every rank when one rank failed)."""
    from torch.distributed.checkpoint.api import CheckpointException

    return (Exception, CheckpointException)


def describe(err: BaseException) -> str:
    """One line per failing rank (``rank 1: RuntimeError: ...``) for DCP's ``CheckpointException``, which otherwise
    prints every rank's traceback; the first line of the message for any other error."""
    failures = getattr(err, "failures", None)
    if isinstance(failures, dict) and failures:
        return "; ".join(
            f"rank {rank}: {type(pair[0]).__name__}: {_first_line(pair[0])}" for rank, pair in sorted(failures.items())
        )
    return f"{type(err).__name__}: {_first_line(err)}"
