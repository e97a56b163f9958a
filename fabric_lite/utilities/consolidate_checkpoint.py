"""Turn a sharded checkpoint folder (``FSDPStrategy``'s default, ``ModelParallelStrategy``'s, or
``DeepSpeedStrategy``'s) into one full checkpoint file: :func:`consolidate_checkpoint`, and the command line at
Lightning Fabric's module path.

    python -m fabric_lite.utilities.consolidate_checkpoint checkpoints/step-1000 --output_file step-1000.ckpt
    fabric-lite consolidate checkpoints/step-1000 --output_file step-1000.ckpt   # the same

The file holds every entry whole, on the CPU, in the layout of ``FSDPStrategy(state_dict_type="full")``: a
module's state dict as ``module.state_dict()`` gives it (it loads anywhere, with or without fabric_lite), optimizer
state keyed by parameter name. It needs no process group and no GPU, but the memory to hold the whole checkpoint.
The command line is Lightning's (``fabric consolidate``, and ``python -m`` this module under Lightning's name):
without ``--output_file`` the file is written beside the folder, named after it with the suffix ``.consolidated``,
and an existing file is never overwritten.

``fabric_lite.utilities.consolidate_checkpoint`` names both this module and the function (fabric_lite's public name,
from :mod:`fabric_lite.utilities.consolidate`): once the module is imported, the import system puts it where the
package had the function, so the module is callable as the function.
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
    """Write the sharded checkpoint in ``checkpoint_folder`` as one ``torch.save`` file at ``output_file``.

    The file is written atomically (:func:`~fabric_lite.runtime.checkpoint.atomic_save`), with what torch's
    ``torch.distributed.checkpoint.format_utils.dcp_to_torch_save`` would write. Run it in one process: it reads
    every shard.
    A DeepSpeed checkpoint folder (``DeepSpeedStrategy``'s) becomes ``{model_key: float32 weights, **other entries}``
    through DeepSpeed's ``get_fp32_state_dict_from_zero_checkpoint`` (no optimizer state; needs DeepSpeed).

    Either may be an fsspec URL (``s3://bucket/run/step-1000``): the folder is then read with torch's
    ``FsspecReader`` and the file uploaded whole (see :mod:`fabric_lite.runtime.checkpoint`).

    Returns:
        The path of the file written (a ``Path``; the URL string for a URL).

    Raises:
        FileNotFoundError: nothing exists at ``checkpoint_folder``.
        CheckpointError: ``checkpoint_folder`` is not a sharded checkpoint (a plain file, or a folder without DCP's
            ``.metadata``), ``output_file`` is a folder, or reading or writing failed; the message names the path.

    Example::

        from fabric_lite.utilities import consolidate_checkpoint

        consolidate_checkpoint("checkpoints/step-1000", "step-1000.ckpt")
        state = torch.load("step-1000.ckpt", weights_only=True)  # {"model": {...}, "optimizer": {...}, ...}
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
    """Add the arguments of the consolidate command (Lightning's): ``CHECKPOINT_FOLDER [--output_file FILE]``.

    Example::

        parser = argparse.ArgumentParser()
        add_consolidate_arguments(parser)
        parser.parse_args(["ckpt", "--output_file", "out.pt"])  # Namespace(checkpoint_folder='ckpt', ...)
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
    """The command line of this module (``sys.argv``): ``checkpoint_folder`` and ``output_file`` (None when not
    given), unchecked (see :func:`_process_cli_args`)."""
    parser = argparse.ArgumentParser(
        prog="python -m fabric_lite.utilities.consolidate_checkpoint", description=_DESCRIPTION
    )
    add_consolidate_arguments(parser)
    return parser.parse_args()


def _checked(args: argparse.Namespace) -> argparse.Namespace:
    """``args`` checked: the folder is a sharded checkpoint and the output file does not exist yet (its default
    filled in). Local paths become ``Path`` objects; URLs stay strings, and their folder is checked when read.

    Raises:
        RuntimeError: torch is older than 2.3.
        FileNotFoundError, NotADirectoryError, CheckpointError, FileExistsError: the message names the path and the
            fix (in Lightning's wording).
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
    """``args`` of the command line checked, as ``Namespace(checkpoint_folder, output_file)`` with the default output
    file filled in; a problem is logged (with the path and the fix) and ends the program with status 1."""
    try:
        return _checked(args)
    except (RuntimeError, OSError, CheckpointError) as err:
        _log.error(str(err))
        sys.exit(1)


def run_consolidate(args: argparse.Namespace) -> int:
    """Run the consolidate command with parsed arguments; returns the exit status: 0, or 1 with the reason on
    stderr (no such folder, not a sharded checkpoint folder, an output file that exists, a failed read or write).

    Example::

        parser = argparse.ArgumentParser()
        add_consolidate_arguments(parser)
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
    """This module, which may stand where ``fabric_lite.utilities`` had the function :func:`consolidate_checkpoint`
    (see the module's docstring): calling it calls the function."""

    def __call__(self, checkpoint_folder: _PATH, output_file: _PATH) -> Any:
        return consolidate_checkpoint(checkpoint_folder, output_file)


sys.modules[__name__].__class__ = _CallableModule


if __name__ == "__main__":
    sys.exit(run_consolidate(_parse_cli_args()))
