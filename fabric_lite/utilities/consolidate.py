"""Turn a sharded checkpoint folder (``FSDPStrategy``'s default, or ``DeepSpeedStrategy``'s) into one full checkpoint
file.

    fabric-lite consolidate checkpoints/step-1000 --output_file step-1000.ckpt
    python -m fabric_lite.utilities.consolidate checkpoints/step-1000 step-1000.ckpt   # the same

The file holds every entry whole, on the CPU, in the layout of ``FSDPStrategy(state_dict_type="full")``: a
module's state dict as ``module.state_dict()`` gives it (it loads anywhere, with or without fabric_lite), optimizer
state keyed by parameter name. It needs no process group and no GPU, but the memory to hold the whole checkpoint.
The command line is Lightning's ``fabric consolidate``: without ``--output_file`` the file is written beside the
folder, named after it with the suffix ``.consolidated``, and an existing file is never overwritten. The same from
Python: :func:`fabric_lite.utilities.consolidate_checkpoint`, which says what a DeepSpeed folder becomes.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from fabric_lite.utilities._fs import _is_remote, _local_path
from fabric_lite.utilities.checkpoint import deepspeed
from fabric_lite.utilities.checkpoint.files import CheckpointError, atomic_save
from fabric_lite.utilities.checkpoint.folders import check_sharded_checkpoint, read_entries
from fabric_lite.utilities.cloud_io import get_filesystem
from fabric_lite.utilities.types import _PATH

__all__ = ["add_consolidate_arguments", "consolidate_checkpoint", "main", "run_consolidate"]


def consolidate_checkpoint(checkpoint_folder: _PATH, output_file: _PATH) -> Any:
    """Write the sharded checkpoint in ``checkpoint_folder`` as one ``torch.save`` file at ``output_file``.

    The file is written atomically (:func:`~fabric_lite.utilities.checkpoint.atomic_save`), with what torch's
    ``torch.distributed.checkpoint.format_utils.dcp_to_torch_save`` would write. Run it in one process: it reads
    every shard.
    A DeepSpeed checkpoint folder (``DeepSpeedStrategy``'s) becomes ``{model_key: float32 weights, **other entries}``
    through DeepSpeed's ``get_fp32_state_dict_from_zero_checkpoint`` (no optimizer state; needs DeepSpeed).

    Either may be an fsspec URL (``s3://bucket/run/step-1000``): the folder is then read with torch's
    ``FsspecReader`` and the file uploaded whole (see :mod:`fabric_lite.utilities.checkpoint`).

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

    ``python -m fabric_lite.utilities.consolidate`` also takes the output file as a second positional argument.

    Example::

        parser = argparse.ArgumentParser()
        add_consolidate_arguments(parser)
        parser.parse_args(["ckpt", "--output_file", "out.pt"])  # Namespace(checkpoint_folder='ckpt', ...)
    """
    parser.add_argument(
        "checkpoint_folder",
        metavar="CHECKPOINT_FOLDER",
        help="the folder fabric.save wrote with FSDPStrategy() (it holds a .metadata file and *.distcp shards) or with"
        " DeepSpeedStrategy() (it holds a checkpoint/ folder)",
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


def run_consolidate(args: argparse.Namespace) -> int:
    """Run the consolidate command with parsed arguments; returns the exit status: 0, or 1 with the reason on
    stderr (no such folder, not a sharded checkpoint folder, an output file that exists, a failed read or write).

    Example::

        parser = argparse.ArgumentParser()
        add_consolidate_arguments(parser)
        run_consolidate(parser.parse_args(["checkpoints/step-1000"]))  # writes checkpoints/step-1000.consolidated
    """
    output = getattr(args, "output", None) or args.output_file
    folder = str(args.checkpoint_folder)
    named = folder if _is_remote(folder) else str(Path(_local_path(folder)))
    target = output if output is not None else named.rstrip("/") + ".consolidated"  # beside the folder
    try:
        if not _is_remote(folder):
            local = Path(_local_path(folder))
            if not local.exists():
                raise FileNotFoundError(
                    f"The checkpoint folder {str(local)!r} does not exist. Pass the folder that fabric.save wrote"
                    " with FSDPStrategy()."
                )
            if not deepspeed.is_deepspeed_checkpoint(local):
                check_sharded_checkpoint(local)
        if get_filesystem(target).exists(target) if _is_remote(target) else Path(_local_path(target)).exists():
            raise FileExistsError(
                f"The output file {str(target)!r} exists already. Choose another path with --output_file, or move or"
                " delete the file first."
            )
        written = consolidate_checkpoint(folder, target)
    except (CheckpointError, FileNotFoundError, FileExistsError, ImportError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    size = f" ({written.stat().st_size / 1e6:.1f} MB)" if isinstance(written, Path) else ""
    print(f"wrote {written}{size}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """The command line: ``python -m fabric_lite.utilities.consolidate FOLDER [OUTPUT | --output_file OUTPUT]``;
    returns the exit status (see :func:`run_consolidate`).

    Example::

        python -m fabric_lite.utilities.consolidate checkpoints/step-1000 step-1000.ckpt
        # wrote step-1000.ckpt (604.1 MB)
    """
    parser = argparse.ArgumentParser(
        prog="python -m fabric_lite.utilities.consolidate",
        description="Consolidate a sharded checkpoint folder (FSDPStrategy) into one full checkpoint file.",
    )
    add_consolidate_arguments(parser)
    parser.add_argument("output", nargs="?", metavar="OUTPUT", help="the file to write (or --output_file)")
    args = parser.parse_args(argv)
    if args.output is not None and args.output_file is not None:
        parser.error(f"give the output file once: {args.output!r} or --output_file {args.output_file!r}")
    return run_consolidate(args)


if __name__ == "__main__":
    sys.exit(main())
