"""Turn a sharded checkpoint folder (``FSDPStrategy``'s default) into one full checkpoint file.

    python -m fabric_lite.utilities.consolidate checkpoints/step-1000 step-1000.ckpt

The file holds every entry whole, on the CPU, in the layout of ``FSDPStrategy(state_dict_type="full")``: a
module's state dict as ``module.state_dict()`` gives it (it loads anywhere, with or without fabric_lite), optimizer
state keyed by parameter name. It needs no process group and no GPU, but the memory to hold the whole checkpoint.
The same from Python: :func:`fabric_lite.utilities.consolidate_checkpoint`.
"""

from __future__ import annotations

import argparse
import sys

from fabric_lite.utilities._dcp import consolidate_checkpoint
from fabric_lite.utilities.checkpoint import CheckpointError

__all__ = ["consolidate_checkpoint", "main"]


def main(argv: list[str] | None = None) -> int:
    """The command line: ``python -m fabric_lite.utilities.consolidate SRC DST``; returns the exit status (1, with
    the reason on stderr, when SRC is not a sharded checkpoint folder or cannot be read).

    Example::

        python -m fabric_lite.utilities.consolidate checkpoints/step-1000 step-1000.ckpt
        # wrote step-1000.ckpt (604.1 MB)
    """
    parser = argparse.ArgumentParser(
        prog="python -m fabric_lite.utilities.consolidate",
        description="Consolidate a sharded checkpoint folder (FSDPStrategy) into one full checkpoint file.",
    )
    parser.add_argument("checkpoint_folder", help="the folder fabric.save wrote with FSDPStrategy()")
    parser.add_argument("output_file", help="the file to write")
    args = parser.parse_args(argv)
    try:
        written = consolidate_checkpoint(args.checkpoint_folder, args.output_file)
    except (CheckpointError, FileNotFoundError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    print(f"wrote {written} ({written.stat().st_size / 1e6:.1f} MB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
