"""A tiny DDP training run for the SLURM tier: every rank trains a few steps and prints one RESULT line.

    srun -n 2 python tests/helpers/scripts/slurm_train.py                 # SLURM starts both ranks
    python tests/helpers/scripts/slurm_train.py --devices 2               # the reference: fabric_lite's own launcher

The RESULT line (JSON) says who started the process (its parent's name), which cluster environment fabric_lite
chose, the ranks, the results of an ``all_reduce`` and an ``all_gather`` with rank-dependent inputs, and the
trained weights, so that tests can compare them exactly with the reference run.
"""

from __future__ import annotations

import argparse
import json
import os
from datetime import timedelta
from pathlib import Path

import torch
from torch import nn

from fabric_lite import Fabric
from fabric_lite.strategies import DDPStrategy


def emit(line: str) -> None:
    # one write() per line: lines from several processes sharing a pipe or a file never interleave
    os.write(1, (line + "\n").encode())


def parent_name() -> str:
    try:
        return Path(f"/proc/{os.getppid()}/comm").read_text().strip()
    except OSError:
        return "?"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--devices", default="auto", help="an int, or 'auto' (SLURM's tasks per node)")
    parser.add_argument("--num-nodes", type=int, default=1)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--fail-rank", type=int, default=-1, help="this rank raises in step 1")
    parser.add_argument("--timeout", type=float, default=30.0, help="process-group timeout in seconds")
    args = parser.parse_args()

    devices: int | str = int(args.devices) if args.devices.isdigit() else args.devices
    strategy = DDPStrategy(timeout=timedelta(seconds=args.timeout))
    fabric = Fabric(accelerator="cpu", devices=devices, num_nodes=args.num_nodes, strategy=strategy)
    fabric.launch()
    rank, world = fabric.global_rank, fabric.world_size

    fabric.seed_everything(7)  # the same initial weights on every rank and in every run
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = fabric.setup(model, optimizer)
    data = torch.Generator().manual_seed(100 + rank)  # each rank its own batches: DDP averages the gradients
    for step in range(args.steps):
        if step == 1 and rank == args.fail_rank:
            raise RuntimeError(f"rank {rank} fails on purpose in step {step}")
        x = torch.randn(16, 4, generator=data)
        loss = (model(x) - x.sum(dim=1, keepdim=True)).pow(2).mean()
        optimizer.zero_grad()
        fabric.backward(loss)
        optimizer.step()

    environment = fabric.strategy.cluster_environment
    result = {
        "rank": rank,
        "local_rank": fabric.local_rank,
        "node_rank": fabric.node_rank,
        "world": world,
        "environment": type(environment).__name__,
        "main_port": environment.main_port if environment is not None else None,
        "pid": os.getpid(),
        "parent": parent_name(),
        "job_name": os.environ.get("SLURM_JOB_NAME"),
        "job_id": os.environ.get("SLURM_JOB_ID"),
        "step_id": os.environ.get("SLURM_STEP_ID"),
        "all_reduce": fabric.all_reduce(torch.tensor(float(rank + 1)), reduce_op="sum").item(),
        "all_gather": fabric.all_gather(torch.tensor([rank * 10])).flatten().tolist(),
        "weights": torch.cat([p.detach().flatten() for p in model.parameters()]).tolist(),
    }
    emit("RESULT " + json.dumps(result))


if __name__ == "__main__":
    main()
