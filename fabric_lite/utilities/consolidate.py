"""fabric_lite's public module for :func:`consolidate_checkpoint` and the consolidate command, whose code lives at
Lightning's path, :mod:`fabric_lite.utilities.consolidate_checkpoint`.

    fabric-lite consolidate checkpoints/step-1000 --output_file step-1000.ckpt
"""

from __future__ import annotations

import argparse
import sys

from fabric_lite.utilities.consolidate_checkpoint import (
    add_consolidate_arguments,
    consolidate_checkpoint,
    run_consolidate,
)

__all__ = ["add_consolidate_arguments", "consolidate_checkpoint", "main", "run_consolidate"]


def main(argv: list[str] | None = None) -> int:
    """``python -m fabric_lite.utilities.consolidate FOLDER [OUTPUT | --output_file OUTPUT]``; returns the exit status.

    Example::

        python -m fabric_lite.utilities.consolidate checkpoints/step-1000 step-1000.ckpt
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
    output = args.output if args.output is not None else args.output_file
    return run_consolidate(argparse.Namespace(checkpoint_folder=args.checkpoint_folder, output_file=output))


if __name__ == "__main__":
    sys.exit(main())
