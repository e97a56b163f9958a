"""A training script for `fabric-lite run` (tests/distributed/test_cli.py, tests/tiers/two_hosts/test_two_hosts.py):
`Fabric()` takes every setting from the command line; each rank runs two collectives, trains a small model on a fixed
global batch of 12 samples (12 // world_size per rank), checkpoints after every step and resumes from the checkpoint if
it exists.

    fabric-lite run --accelerator cpu --devices 2 tests/helpers/scripts/cli_train.py --out final.pt \\
        --checkpoint last.ckpt

Every rank prints one `RESULT {json}` line; rank 0 saves the final weights to --out.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from fabric_lite import Fabric
from fabric_lite.strategies import DDPStrategy

GLOBAL_BATCH = 12


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", help="rank 0 saves the final weights here")
    parser.add_argument("--checkpoint", help="saved after every step; loaded at the start if it exists")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--step-sleep", type=float, default=0.0, help="seconds to wait after each step")
    parser.add_argument("--started", help="rank 0 creates this file once the first step is done")
    parser.add_argument("--kill-rank", type=int, default=-1, help="this rank SIGKILLs itself once (first attempt)")
    parser.add_argument("--kill-step", type=int, default=3)
    parser.add_argument("--fail-rank", type=int, default=-1, help="this rank raises at step 1")
    parser.add_argument("--pg-timeout", type=float, help="DDPStrategy(timeout=...) in seconds")
    parser.add_argument("--fabric-devices", help="pass devices=... to Fabric (to test a disagreement)")
    return parser.parse_args()


def model_optimizer_data() -> tuple[nn.Module, torch.optim.Optimizer, TensorDataset]:
    """The same initial weights and data on every rank and in every run (the tests' plain-PyTorch reference too)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    return model, optimizer, TensorDataset(torch.randn(48, 4), torch.randn(48, 1))


def emit(line: str) -> None:
    os.write(1, (line + "\n").encode())  # one write per line: ranks sharing a pipe never interleave


def main() -> None:
    args = parse()
    kwargs: dict[str, Any] = {}
    if args.pg_timeout is not None:
        # the group may take long to form on a loaded machine; collectives fail after --pg-timeout once it has
        kwargs["strategy"] = DDPStrategy(timeout=timedelta(seconds=max(args.pg_timeout, 120)))
    if args.fabric_devices is not None:
        kwargs["devices"] = int(args.fabric_devices) if args.fabric_devices.isdigit() else args.fabric_devices
    fabric = Fabric(**kwargs)
    fabric.launch()
    if args.pg_timeout is not None:
        fabric.strategy.set_collective_timeout(timedelta(seconds=args.pg_timeout))
    rank, world = fabric.global_rank, fabric.world_size
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))

    total = fabric.all_reduce(torch.tensor(float(rank + 1)), reduce_op="sum")
    gathered = fabric.all_gather(torch.tensor([rank]))

    model, optimizer, data = model_optimizer_data()
    model, optimizer = fabric.setup(model, optimizer)
    loader = fabric.setup_dataloaders(DataLoader(data, batch_size=GLOBAL_BATCH // world, shuffle=False))
    batches = list(loader)

    state: dict[str, Any] = {"model": model, "optimizer": optimizer, "step": 0}
    if args.checkpoint and os.path.exists(args.checkpoint):
        fabric.load(args.checkpoint, state)
    start_step = state["step"]
    for step in range(start_step, args.steps):
        if rank == args.kill_rank and step == args.kill_step and attempt == 0:
            os.kill(os.getpid(), signal.SIGKILL)
        if rank == args.fail_rank and step == 1:
            raise RuntimeError(f"rank {rank} fails on purpose at step {step}")
        x, y = batches[step % len(batches)]
        loss = nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        fabric.backward(loss)
        optimizer.step()
        state["step"] = step + 1
        if args.checkpoint:
            fabric.save(args.checkpoint, state)
        if args.started and rank == 0 and step == start_step:
            Path(args.started).touch()
        time.sleep(args.step_sleep)

    if rank == 0 and args.out:
        torch.save({k: v.detach().clone() for k, v in model.state_dict().items()}, args.out)
    result = {
        "rank": rank,
        "world": world,
        "local_rank": fabric.local_rank,
        "node_rank": fabric.node_rank,
        "pid": os.getpid(),
        "ppid": os.getppid(),
        "strategy": type(fabric.strategy).__name__,
        "accelerator": type(fabric.accelerator).__name__,
        "precision": type(fabric.strategy.precision).__name__,
        "dtype": str(next(model.parameters()).dtype),
        "torchelastic": "TORCHELASTIC_RUN_ID" in os.environ,
        "main": f"{os.environ.get('MASTER_ADDR')}:{os.environ.get('MASTER_PORT')}",
        "attempt": attempt,
        "start_step": start_step,
        "total": total.item(),
        "gathered": gathered.flatten().tolist(),
        "threads": [os.environ.get("OMP_NUM_THREADS"), torch.get_num_threads()],
    }
    emit("RESULT " + json.dumps(result))


if __name__ == "__main__":
    main()
