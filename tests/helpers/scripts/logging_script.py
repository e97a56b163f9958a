"""Loggers and callbacks on two CPU processes, without any explicit flush at the end.

python tests/helpers/scripts/logging_script.py ROOT STRATEGY   (STRATEGY: ddp, ddp_spawn or ddp_fork)

Writes ROOT/result_rank{N}.json for each rank. ROOT/exp must hold version_0 and version_1 already.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import torch

from fabric_lite import Fabric
from fabric_lite.loggers import CSVLogger


class Recorder:
    """A logger that is not fabric_lite's and knows nothing of ranks: Fabric alone must call it on rank 0 only."""

    def __init__(self) -> None:
        self.calls: list[Any] = []

    def log_metrics(self, metrics: dict[str, Any], step: int | None = None) -> None:
        self.calls.append([metrics, step])


class EpochHook:
    def __init__(self) -> None:
        self.seen: list[int] = []

    def on_epoch_end(self, epoch: int) -> None:
        self.seen.append(epoch)


def run(fabric: Fabric) -> None:
    rank = fabric.global_rank
    csv_logger, recorder = fabric.loggers
    for step in range(3):  # every rank logs its own values; only rank 0's may reach the file
        fabric.log_dict({"rank_value": torch.tensor(float(10 * rank + step)), "step_sq": step * step}, step=step)
    fabric.log("late", rank + 0.5, step=3)  # a column that appears later
    fabric.call("on_epoch_end", epoch=1, loss=0.5)
    # rank 0 creates its version folder now; rank 1 asks for log_dir only afterwards, and must still name rank 0's
    # folder (scanning the disk by itself now, it would find version_2 taken and pick version_3)
    csv_logger.save()
    fabric.barrier()
    fabric.log("final", 1, step=4)  # buffered: only the end of the run (launch's end, or the exit) writes it
    hook = fabric._callbacks[0]
    result = {"rank": rank, "log_dir": csv_logger.log_dir, "recorder": recorder.calls, "hook": hook.seen}
    with open(os.path.join(fabric.loggers[0].root_dir, f"result_rank{rank}.json"), "w") as f:
        json.dump(result, f)  # a file per rank: lines that two processes print to one pipe can interleave


if __name__ == "__main__":
    root, strategy = sys.argv[1], sys.argv[2]
    fabric = Fabric(
        accelerator="cpu",
        devices=2,
        strategy=strategy,
        loggers=[CSVLogger(root, name="exp"), Recorder()],
        callbacks=EpochHook(),
    )
    if strategy == "ddp":
        fabric.launch()
        run(fabric)
    else:
        fabric.launch(run)
