"""Sharded checkpoint folders written with ``torch.distributed.checkpoint`` (DCP): how to recognise, publish and read
them.

A sharded checkpoint is a folder: one ``__<rank>_0.distcp`` file per rank (that rank's shards), and ``.metadata``,
written last by the coordinator once every rank's files are complete. fabric_lite adds ``fabric_lite.json``, which
says which top-level entries were modules and optimizers (their state is sharded, so they are loaded into a
module/optimizer, never returned as a plain value).

Writing is made atomic at the folder level: every rank writes into a temporary folder beside the target
(:func:`make_temp_folder`), and rank 0 swaps it into place (:func:`publish_folder`), so a failed or interrupted save
leaves the previous checkpoint intact.

:func:`consolidate_checkpoint` (public as ``fabric_lite.utilities.consolidate_checkpoint``; its command line is
``python -m fabric_lite.utilities.consolidate``) turns a folder into one full file.

Nothing here imports ``torch.distributed.checkpoint`` at module level: ``import fabric_lite`` stays cheap.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from fabric_lite.utilities.checkpoint import CheckpointError, _file_mode, _fsync_folder
from fabric_lite.utilities.types import _PATH

#: the file DCP writes last, once every rank's shards are complete: a folder holding it is a sharded checkpoint
METADATA_FILE = ".metadata"
#: fabric_lite's own index of a sharded checkpoint: which top-level entries are modules and optimizers
INDEX_FILE = "fabric_lite.json"


def is_sharded_checkpoint(path: _PATH) -> bool:
    """Whether ``path`` is a folder written by ``torch.distributed.checkpoint`` (it holds a ``.metadata`` file).

    Example::

        is_sharded_checkpoint("checkpoints/step-100")  # True for what fabric.save wrote with FSDPStrategy()
    """
    return (Path(path) / METADATA_FILE).is_file()


def check_sharded_checkpoint(path: _PATH) -> Path:
    """``path`` as a ``Path`` if it is a sharded checkpoint folder; otherwise an error that says what it is instead.

    Raises:
        FileNotFoundError: nothing exists at ``path``.
        CheckpointError: ``path`` is a file (a full checkpoint, or one file of a sharded checkpoint), or a folder
            without DCP's ``.metadata``.
    """
    folder = Path(path)
    if is_sharded_checkpoint(folder):
        return folder
    if folder.is_file():
        if folder.name == METADATA_FILE or folder.suffix == ".distcp":
            raise CheckpointError(
                f"{str(folder)!r} is one file of a sharded checkpoint, not the checkpoint: pass its folder"
                f" {str(folder.parent)!r}."
            )
        raise CheckpointError(
            f"{str(folder)!r} is a file (a full checkpoint, e.g. from torch.save or a non-FSDP strategy), not a sharded"
            " checkpoint folder written by torch.distributed.checkpoint. Load it with fabric.load (which reads full"
            " files too), or pass the folder that fabric.save wrote with FSDPStrategy(state_dict_type='sharded')."
        )
    if folder.is_dir():
        found = sorted(p.name for p in folder.iterdir())
        shown = ", ".join(found[:5]) + (", ..." if len(found) > 5 else "") if found else "nothing"
        raise CheckpointError(
            f"The folder {str(folder)!r} is not a sharded checkpoint: torch.distributed.checkpoint writes a"
            f" {METADATA_FILE!r} file into every checkpoint folder, and this one holds {shown}. Pass the folder that"
            " fabric.save wrote with FSDPStrategy(), or the path of a checkpoint file."
        )
    raise FileNotFoundError(f"Checkpoint not found: {str(folder)!r}.")


def make_temp_folder(target: _PATH) -> Path:
    """A new, empty folder beside ``target`` (``.<name>.<random>.tmp``), with the mode a plain ``mkdir`` gives.

    Raises:
        CheckpointError: ``target`` is a folder that is not a sharded checkpoint (replacing it would delete
            whatever it holds), or the folder cannot be created.
    """
    target = Path(target)
    if target.is_dir() and not is_sharded_checkpoint(target):
        raise CheckpointError(
            f"Cannot save a sharded checkpoint to {str(target)!r}: a folder that is not a checkpoint exists there,"
            " and saving would replace it and everything in it. Choose another path, or remove the folder first."
        )
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        temp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent))
        file_mode = _file_mode(target.parent / f".{target.name}.mode-probe")
        os.chmod(temp, file_mode | ((file_mode & 0o444) >> 2))  # rw for the file mode, x where it is readable
    except OSError as err:
        raise CheckpointError(f"Cannot save the checkpoint to {str(target)!r}: {err}.") from err
    return temp


def write_index(folder: Path, modules: Iterable[str], optimizers: Iterable[str]) -> None:
    """Record which top-level entries of the checkpoint in ``folder`` are modules and optimizers."""
    index = {"format": 1, "modules": sorted(modules), "optimizers": sorted(optimizers)}
    with open(folder / INDEX_FILE, "w") as f:
        json.dump(index, f)
        f.flush()
        os.fsync(f.fileno())


def read_index(folder: Path) -> dict[str, list[str]]:
    """What :func:`write_index` recorded; empty lists for a folder that DCP wrote without fabric_lite."""
    try:
        index = json.loads((folder / INDEX_FILE).read_text())
    except (OSError, ValueError):
        return {"modules": [], "optimizers": []}
    return {"modules": list(index.get("modules", [])), "optimizers": list(index.get("optimizers", []))}


def publish_folder(temp: Path, target: _PATH) -> None:
    """Put the complete checkpoint folder ``temp`` at ``target``, replacing what was there (a previous checkpoint
    folder or file). The previous checkpoint is only deleted once the new one is in place.

    Raises:
        CheckpointError: a rename failed; ``target`` then still holds the previous checkpoint.
    """
    target = Path(target)
    previous: Path | None = None
    try:
        if target.exists() or target.is_symlink():
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
        raise CheckpointError(
            f"Saving the checkpoint to {str(target)!r} failed: {type(err).__name__}: {err}. The previous checkpoint at"
            " that path, if any, is unchanged."
        ) from err
    if previous is not None:
        remove(previous)


def remove(path: Path) -> None:
    """Delete a file or folder, ignoring what is already gone."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(OSError):
            path.unlink()


def read_metadata(folder: Path) -> Any:
    """The checkpoint's DCP ``Metadata``; a :class:`CheckpointError` naming the folder when it is unreadable."""
    from torch.distributed.checkpoint.filesystem import FileSystemReader

    try:
        return FileSystemReader(str(folder)).read_metadata()
    except dcp_errors() as err:
        raise CheckpointError(
            f"The sharded checkpoint {str(folder)!r} is incomplete or corrupt: its {METADATA_FILE} cannot be read"
            f" ({describe(err)})."
        ) from err


def top_level_keys(metadata: Any) -> list[str]:
    """The top-level entries of a checkpoint (``"model"``, ``"step"``, ...) from its DCP metadata."""
    keys: dict[str, None] = {}
    planner_data = metadata.planner_data or {}
    for flat_key in metadata.state_dict_metadata:
        path = planner_data.get(flat_key)
        keys[str(path[0]) if path else flat_key] = None
    return list(keys)


def entry_keys(metadata: Any, entry: str) -> set[str]:
    """The keys of top-level entry ``entry`` (e.g. a module's parameter names) in a checkpoint's DCP metadata."""
    planner_data = metadata.planner_data or {}
    found = set()
    for flat_key in metadata.state_dict_metadata:
        path = planner_data.get(flat_key)
        if path and str(path[0]) == entry and len(path) > 1:
            found.add(str(path[1]))
    return found


def read_entries(folder: Path, keys: list[str] | None) -> dict[str, Any]:
    """Read the top-level entries ``keys`` (all of them with ``None``) into memory, whole, in this process.

    Tensors come back whole (not sharded) on the CPU; everything else as it was saved. Each process reads on its
    own (no collective), so it suits small entries on every rank, or one process consolidating a checkpoint.
    Non-tensor values are unpickled with ``weights_only=True`` by DCP itself.
    """
    # torch's own dcp_to_torch_save pairs these two private helpers to rebuild a state dict from the metadata alone;
    # the public ``dcp.load`` cannot do that (it fills the entries of a state dict you already have)
    from torch.distributed.checkpoint.default_planner import _EmptyStateDictLoadPlanner
    from torch.distributed.checkpoint.filesystem import FileSystemReader
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

    state: dict[str, Any] = {}
    if keys is not None and not keys:
        return state
    try:
        _load_state_dict(
            state,
            storage_reader=FileSystemReader(str(folder)),
            planner=_EmptyStateDictLoadPlanner(keys=keys),  # type: ignore[no-untyped-call]
            no_dist=True,
        )
    except dcp_errors() as err:
        raise CheckpointError(
            f"Reading {keys if keys is not None else 'every entry'} from the sharded checkpoint {str(folder)!r}"
            f" failed: {describe(err)}"
        ) from err
    return state


def consolidate_checkpoint(checkpoint_folder: _PATH, output_file: _PATH) -> Path:
    """Write the sharded checkpoint in ``checkpoint_folder`` as one ``torch.save`` file at ``output_file``.

    The file is written atomically (a temporary file beside it, renamed into place), with torch's
    ``torch.distributed.checkpoint.format_utils.dcp_to_torch_save``. Run it in one process: it reads every shard.

    Returns:
        The path of the file written.

    Raises:
        FileNotFoundError: nothing exists at ``checkpoint_folder``.
        CheckpointError: ``checkpoint_folder`` is not a sharded checkpoint (a plain file, or a folder without DCP's
            ``.metadata``), ``output_file`` is a folder, or reading or writing failed; the message names the path.

    Example::

        from fabric_lite.utilities import consolidate_checkpoint

        consolidate_checkpoint("checkpoints/step-1000", "step-1000.ckpt")
        state = torch.load("step-1000.ckpt", weights_only=True)  # {"model": {...}, "optimizer": {...}, ...}
    """
    folder = check_sharded_checkpoint(checkpoint_folder)
    target = Path(output_file)
    if target.is_dir():
        raise CheckpointError(f"Cannot write the consolidated checkpoint to {str(target)!r}: it is a folder.")
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    target.parent.mkdir(parents=True, exist_ok=True)
    fd, temp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    os.close(fd)
    try:
        dcp_to_torch_save(folder, temp)
        os.chmod(temp, _file_mode(target))
        with open(temp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(temp, target)
        _fsync_folder(target.parent)
    except BaseException as err:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        if isinstance(err, dcp_errors()) and not isinstance(err, CheckpointError):
            raise CheckpointError(
                f"Consolidating {str(folder)!r} into {str(target)!r} failed: {describe(err)}."
                " A previous file at that path, if any, is unchanged."
            ) from err
        raise
    return target


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


def _first_line(err: BaseException) -> str:
    lines = [line for line in str(err).splitlines() if line.strip()]
    return lines[0] if lines else type(err).__name__
