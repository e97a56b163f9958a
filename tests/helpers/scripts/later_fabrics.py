"""A script for the launcher tests: one ``ddp`` job (2 ranks) in which later ``Fabric`` objects join the first.

Each rank prints one ``ROUND`` line per Fabric: a second Fabric while the process group lives (it joins it), a third
after the group was destroyed (every rank forms a new one over the same rendezvous), a ``ModelParallelStrategy``
with another layout over the same ranks, and one asking for another number of devices (an error on every rank).
"""

from __future__ import annotations

import json
import os
from datetime import timedelta

import torch
import torch.distributed as dist

from fabric_lite import Fabric
from fabric_lite.strategies import DDPStrategy, ModelParallelStrategy


def emit(name: str, fabric: Fabric, **values: object) -> None:
    # one write() per line: lines from several processes sharing a pipe never interleave
    row = {"round": name, "rank": fabric.global_rank, "world": fabric.world_size, "pid": os.getpid(), **values}
    os.write(1, ("ROUND " + json.dumps(row) + "\n").encode())


def total(fabric: Fabric, offset: int) -> float:
    return fabric.all_reduce(torch.tensor(float(fabric.global_rank + offset)), reduce_op="sum").item()


def main() -> None:
    def ddp() -> DDPStrategy:
        return DDPStrategy(timeout=timedelta(seconds=120))  # covers the slowest start of a loaded machine

    first = Fabric(accelerator="cpu", devices=2, strategy=ddp())
    first.launch()
    emit("first", first, total=total(first, 1))

    second = Fabric(accelerator="cpu", devices=2, strategy=ddp())
    second.launch()
    emit("joined", second, total=total(second, 10), group_kept=dist.is_initialized())

    dist.destroy_process_group()
    third = Fabric(accelerator="cpu", devices=2, strategy=ddp())
    third.launch()
    emit("formed again", third, total=total(third, 100))

    layout = ModelParallelStrategy(lambda model, mesh: model, data_parallel_size=1, tensor_parallel_size=2)
    fourth = Fabric(accelerator="cpu", devices=2, strategy=layout)
    fourth.launch()
    emit("model parallel", fourth, mesh=list(fourth.strategy.device_mesh.mesh_dim_names), total=total(fourth, 0))

    try:
        Fabric(accelerator="cpu", devices=3, strategy=ddp()).launch()
        error = None
    except RuntimeError as err:
        error = str(err)
    emit("other devices", first, error=error)
    first.barrier()


if __name__ == "__main__":
    main()
