"""A two-rank job that hangs on purpose, for the hang report (tests/distributed/test_hang_report.py).

    python tests/helpers/scripts/hang_cases.py --case sleep --mode ddp
    python -m torch.distributed.run --standalone --nproc-per-node 2 tests/helpers/scripts/hang_cases.py --case kill \\
        --mode torchrun
    fabric-lite run --accelerator cpu --devices 2 tests/helpers/scripts/hang_cases.py --case skip --mode cli

Both ranks run a few collectives in step, then rank 1 goes wrong: ``sleep`` sleeps before all_reduce #N, ``skip``
skips it (both then meet in a barrier), ``other`` calls ``broadcast`` where rank 0 calls ``barrier``, ``kill`` SIGKILLs
itself. The process-group timeout is 5 s. Every rank prints ``PID <rank> <pid>`` at the start, rank 0 ``RUNDIR
<path>``, rank 1 ``HANG <time.monotonic()>`` just before it goes wrong. The lines the test looks for end with a
``# site: <name>`` comment.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from fabric_lite import Fabric
from fabric_lite.strategies import DDPStrategy

#: the collectives' timeout; the process group forms with a generous one (a loaded machine starts ranks slowly)
TIMEOUT = timedelta(seconds=5)
START_TIMEOUT = timedelta(seconds=120)


def emit(line: str) -> None:
    # one write() per line: with PYTHONUNBUFFERED, print() writes the text and its newline apart, and the ranks'
    # lines (they share the pipe) could run into each other
    os.write(1, (line + "\n").encode())


def run(fabric: Fabric, case: str) -> None:
    fabric.strategy.set_collective_timeout(TIMEOUT)  # type: ignore[attr-defined]
    rank = fabric.global_rank
    emit(f"PID {rank} {os.getpid()}")
    if rank == 0:
        emit(f"RUNDIR {fabric.strategy._diagnostics.trail.run_dir}")  # type: ignore[attr-defined]
    x = torch.tensor(float(rank + 1))
    for _ in range(3):
        fabric.all_reduce(x, reduce_op="sum")  # site: loop
    fabric.barrier()  # site: ready
    if rank == 1:
        emit(f"HANG {time.monotonic()}")
        if case == "sleep":
            time.sleep(600)  # site: sleep
        elif case == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
    if case == "other":
        if rank == 0:
            fabric.barrier()  # site: other0
        else:
            fabric.broadcast(x, src=0)  # site: other1
    elif not (case == "skip" and rank == 1):
        fabric.all_reduce(x, reduce_op="sum")  # site: target
    fabric.barrier()  # site: after
    emit(f"FINISHED {rank}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--case", choices=["sleep", "skip", "other", "kill"], required=True)
    parser.add_argument("--mode", choices=["ddp", "ddp_spawn", "torchrun", "cli"], required=True)
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.mode == "ddp_spawn":
        strategy = DDPStrategy(start_method="spawn", timeout=START_TIMEOUT)
        fabric = Fabric(accelerator="cpu", devices=2, strategy=strategy)
        fabric.launch(run, args.case)
        return
    fabric = Fabric(accelerator="cpu", devices=2, strategy=DDPStrategy(timeout=START_TIMEOUT))
    fabric.launch()
    run(fabric, args.case)


if __name__ == "__main__":
    main()
