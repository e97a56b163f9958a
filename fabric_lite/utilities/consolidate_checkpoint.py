"""Turn a sharded checkpoint folder (FSDP's, ModelParallel's or DeepSpeed's) into one full checkpoint file, with
the command line at Lightning's module path::

    python -m fabric_lite.utilities.consolidate_checkpoint checkpoints/step-1000 --output_file step-1000.ckpt

Once imported, the module is callable as :func:`consolidate_checkpoint`: the import system puts it where
``fabric_lite.utilities`` had that function.
"""

from __future__ import annotations

import argparse
import sys
import types
from pathlib import Path
from typing import Any

from fabric_lite._log import get_logger
from fabric_lite.runtime.checkpoint import deepspeed
from fabric_lite.runtime.checkpoint.files import CheckpointError, atomic_save
from fabric_lite.runtime.checkpoint.folders import (
    LIGHTNING_METADATA_FILE,
    check_sharded_checkpoint,
    is_sharded_checkpoint,
    read_entries,
)
from fabric_lite.utilities._fs import _is_remote, _local_path
from fabric_lite.utilities.cloud_io import get_filesystem
from fabric_lite.utilities.imports import _TORCH_GREATER_EQUAL_2_3
from fabric_lite.utilities.types import _PATH

_log = get_logger(__name__)

_DESCRIPTION = (
    "Convert a sharded checkpoint folder (what fabric.save writes with FSDPStrategy(), ModelParallelStrategy() or"
    " DeepSpeedStrategy()) into a single file that torch.load reads, without fabric_lite, a process group or a GPU."
)


def consolidate_checkpoint(checkpoint_folder: _PATH, output_file: _PATH) -> Any:
    """Write the sharded checkpoint in ``checkpoint_folder`` as one ``torch.save`` file at ``output_file``, atomically.

    Every entry is whole and on the CPU, as ``FSDPStrategy(state_dict_type="full")`` saves it, so the file loads
    without fabric_lite, a process group or a GPU. A DeepSpeed folder becomes
    ``{model_key: float32 weights, **other entries}`` (needs DeepSpeed). Either path may be an fsspec URL. Returns the
    path written (a string for a URL).

    Raises:
        FileNotFoundError: nothing exists at ``checkpoint_folder``.
        CheckpointError: ``checkpoint_folder`` is no sharded checkpoint, ``output_file`` is a folder, or reading or
            writing failed; the message names the path.

    Example::

        consolidate_checkpoint("checkpoints/step-1000", "step-1000.ckpt")
    """
    if not _is_remote(output_file) and deepspeed.is_deepspeed_checkpoint(checkpoint_folder):
        return deepspeed.consolidate(checkpoint_folder, output_file)
    folder = check_sharded_checkpoint(checkpoint_folder)
    if not _is_remote(output_file) and Path(_local_path(output_file)).is_dir():
        raise CheckpointError(f"Cannot write the consolidated checkpoint to {str(output_file)!r}: it is a folder.")
    try:
        state = read_entries(folder, None)  # what torch's dcp_to_torch_save reads, before it saves
    except CheckpointError as err:
        raise CheckpointError(f"Consolidating {str(checkpoint_folder)!r} failed: {err}") from err
    atomic_save(state, output_file)
    return output_file if _is_remote(output_file) else Path(_local_path(output_file))


def add_consolidate_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the consolidate command's arguments (Lightning's): ``CHECKPOINT_FOLDER [--output_file FILE]``; by default the
    file goes beside the folder, with the suffix ``.consolidated``, and no existing file is overwritten.

    Example::

        add_consolidate_arguments(parser)
    """
    parser.add_argument(
        "checkpoint_folder",
        metavar="CHECKPOINT_FOLDER",
        help="the folder fabric.save wrote with FSDPStrategy() or ModelParallelStrategy() (it holds a .metadata file"
        " and *.distcp shards) or with DeepSpeedStrategy() (it holds a checkpoint/ folder)",
    )
    parser.add_argument(
        "--output_file",
        "--output-file",
        dest="output_file",
        metavar="FILE",
        default=None,
        help="the file to write; it must not exist yet. Default: beside the folder, with the folder's name and the"
        " suffix .consolidated (e.g. --output_file step-1000.ckpt).",
    )


def _parse_cli_args() -> argparse.Namespace:
    """This module's command line, unchecked (see :func:`_process_cli_args`)."""
    parser = argparse.ArgumentParser(
        prog="python -m fabric_lite.utilities.consolidate_checkpoint", description=_DESCRIPTION
    )
    add_consolidate_arguments(parser)
    return parser.parse_args()


def _checked(args: argparse.Namespace) -> argparse.Namespace:
    """``args`` checked, with the default output file filled in; local paths become ``Path`` objects.

    Raises:
        RuntimeError: torch is older than 2.3.
        FileNotFoundError, NotADirectoryError, CheckpointError, FileExistsError: in Lightning's wording, with the fix.
    """
    if not _TORCH_GREATER_EQUAL_2_3:
        raise RuntimeError("Processing distributed checkpoints requires PyTorch >= 2.3. Upgrade torch.")
    if _is_remote(args.checkpoint_folder):
        folder: str | Path = str(args.checkpoint_folder).rstrip("/")
    else:
        folder = Path(_local_path(args.checkpoint_folder))
        if not folder.exists():
            raise FileNotFoundError(
                f"The provided checkpoint folder does not exist: {folder}. Pass the folder that fabric.save wrote with"
                " a sharded strategy (FSDPStrategy, ModelParallelStrategy, DeepSpeedStrategy)."
            )
        if not folder.is_dir():
            try:
                check_sharded_checkpoint(folder)  # it says what the file is instead
            except CheckpointError as err:
                raise NotADirectoryError(
                    f"The provided checkpoint path must be a folder, containing the checkpoint shards: {err}"
                ) from None
        # Lightning's folders hold its meta.pt beside DCP's files; DeepSpeed's a checkpoint/ folder
        marked = (folder / LIGHTNING_METADATA_FILE).is_file() or deepspeed.is_deepspeed_checkpoint(folder)
        if not marked and not is_sharded_checkpoint(folder):
            try:
                check_sharded_checkpoint(folder)  # it lists what the folder holds instead
            except CheckpointError as err:
                raise CheckpointError(
                    "Only FSDP-sharded checkpoints saved with Lightning are supported for consolidation, and"
                    f" fabric_lite's sharded and DeepSpeed folders. {err}"
                ) from None
    output = getattr(args, "output_file", None)
    if output is None:  # beside the folder: `step-1000` -> `step-1000.consolidated`
        output_file: str | Path = (
            folder + ".consolidated" if isinstance(folder, str) else folder.with_name(folder.name + ".consolidated")
        )
    else:
        output_file = str(output) if _is_remote(output) else Path(_local_path(output))
    exists = get_filesystem(output_file).exists(output_file) if isinstance(output_file, str) else output_file.exists()
    if exists:
        raise FileExistsError(
            f"The path for the converted checkpoint already exists: {output_file}. It is never overwritten: choose a"
            " different path with --output_file, or move or delete the file first."
        )
    return argparse.Namespace(checkpoint_folder=folder, output_file=output_file)


def _process_cli_args(args: argparse.Namespace) -> argparse.Namespace:
    """:func:`_checked`, where a problem is logged and ends the program with status 1."""
    try:
        return _checked(args)
    except (RuntimeError, OSError, CheckpointError) as err:
        _log.error(str(err))
        sys.exit(1)


def run_consolidate(args: argparse.Namespace) -> int:
    """Run the consolidate command; returns the exit status, 0 or 1 (with the reason on stderr).

    Example::

        run_consolidate(parser.parse_args(["checkpoints/step-1000"]))  # writes checkpoints/step-1000.consolidated
    """
    try:
        config = _checked(args)
        written = consolidate_checkpoint(config.checkpoint_folder, config.output_file)
    except (RuntimeError, OSError, CheckpointError, ImportError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    size = f" ({written.stat().st_size / 1e6:.1f} MB)" if isinstance(written, Path) else ""
    print(f"wrote {written}{size}")
    return 0


class _CallableModule(types.ModuleType):
    """This module, callable as :func:`consolidate_checkpoint` (see the module's docstring)."""

    def __call__(self, checkpoint_folder: _PATH, output_file: _PATH) -> Any:
        return consolidate_checkpoint(checkpoint_folder, output_file)


sys.modules[__name__].__class__ = _CallableModule


if __name__ == "__main__":
    sys.exit(run_consolidate(_parse_cli_args()))
