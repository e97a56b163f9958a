"""A SLURM job for the auto-requeue test: it records each start, then waits for the requeue signal on its first run.

    srun -n 2 python tests/helpers/scripts/requeue_job.py --log starts.txt [--no-requeue]

Every rank appends ``start <SLURM_RESTART_COUNT> <rank> <world size> <environment>`` to ``--log`` once Fabric is
set up. On the job's first run (no restart yet) the ranks then wait (at most ``--wait`` seconds) for SLURM's
signal: with auto-requeue, rank 0's handler requeues the job and SLURM ends this run. On a later run (the requeued
job) every rank appends ``done`` and the job ends normally.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from fabric_lite import Fabric
from fabric_lite.plugins.environments import SLURMEnvironment


def append(path: str, line: str) -> None:
    with open(path, "a") as handle:  # one short write per line: lines of several ranks never interleave
        handle.write(line + "\n")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--log", required=True)
    parser.add_argument("--no-requeue", action="store_true", help="SLURMEnvironment(auto_requeue=False)")
    parser.add_argument("--wait", type=float, default=60.0, help="seconds to wait for the signal on the first run")
    args = parser.parse_args()

    plugins = [SLURMEnvironment(auto_requeue=False)] if args.no_requeue else []
    fabric = Fabric(accelerator="cpu", plugins=plugins)  # devices="auto": SLURM's tasks
    fabric.launch()
    restarts = int(os.environ.get("SLURM_RESTART_COUNT", "0"))
    environment = type(fabric.strategy.cluster_environment).__name__  # type: ignore[attr-defined]
    append(args.log, f"start {restarts} {fabric.global_rank} {fabric.world_size} {environment}")
    if restarts == 0:
        fabric.barrier()  # every rank has its handler before the test sends the signal
        if fabric.global_rank == 0:
            append(args.log, "ready")
        deadline = time.monotonic() + args.wait
        while time.monotonic() < deadline:
            time.sleep(0.1)  # short sleeps: the handler runs in the main thread between them
        append(args.log, f"no signal acted on within {args.wait} s")
        sys.exit(3)
    fabric.barrier()
    append(args.log, f"done {fabric.global_rank}")


if __name__ == "__main__":
    main()
