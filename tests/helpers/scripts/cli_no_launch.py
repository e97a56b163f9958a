"""A script for `fabric-lite run` that never calls `fabric.launch()` (tests/distributed/test_cli.py): `Fabric()` alone
joins the process group that the command line set up, as with Lightning's `fabric run`.

    fabric-lite run --accelerator=cpu --devices=2 --strategy=ddp tests/helpers/scripts/cli_no_launch.py --out final.pt

Each rank all-reduces and gathers rank-dependent values, records which samples its DistributedSampler gives it,
trains the model of tests/helpers/scripts/cli_train.py on its half of a fixed global batch, and prints one `RESULT
{json}` line; rank 0 saves the final weights to --out. `--then-launch` also calls `fabric.launch()` and
`fabric.launch(fn)` afterwards (both must be harmless), `--run-method` does the work in a `Fabric` subclass's `run`
(with both, the subclass's object is launched afterwards).
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

import torch
import torch.distributed as dist
from cli_train import GLOBAL_BATCH, emit, model_optimizer_data  # the script's folder is first on sys.path
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from fabric_lite import Fabric


def train(fabric: Fabric, args: argparse.Namespace) -> dict[str, Any]:
    rank, world = fabric.global_rank, fabric.world_size
    result: dict[str, Any] = {"rank": rank, "world": world, "initialized": dist.is_initialized(), "pid": os.getpid()}
    result["group_world"] = dist.get_world_size() if dist.is_initialized() else None
    result["total"] = fabric.all_reduce(torch.tensor(float(rank + 1)), reduce_op="sum").item()
    result["gathered"] = fabric.all_gather(torch.tensor([10 * (rank + 1)])).flatten().tolist()
    model, optimizer, data = model_optimizer_data()
    model, optimizer = fabric.setup(model, optimizer)
    indices = DataLoader(TensorDataset(torch.arange(12)), batch_size=3, shuffle=False)
    indices = fabric.setup_dataloaders(indices)
    result["sampler"] = type(indices.sampler).__name__
    result["indices"] = [i for (batch,) in indices for i in batch.tolist()]
    loader = fabric.setup_dataloaders(DataLoader(data, batch_size=GLOBAL_BATCH // world, shuffle=False))
    result["loader_sampler_is_distributed"] = isinstance(loader.sampler, DistributedSampler)
    batches = list(loader)
    for step in range(args.steps):
        x, y = batches[step % len(batches)]
        loss = nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        fabric.backward(loss)
        optimizer.step()
    if rank == 0 and args.out:
        torch.save({k: v.detach().clone() for k, v in model.state_dict().items()}, args.out)
    return result


class RunFabric(Fabric):
    def run(self, args: argparse.Namespace) -> dict[str, Any]:
        result = train(self, args)
        result["via"] = "run"
        return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--then-launch", action="store_true")
    parser.add_argument("--run-method", action="store_true")
    args = parser.parse_args()
    if args.run_method:
        fabric: Fabric = RunFabric()
        result = fabric.run(args)
    else:
        fabric = Fabric()
        result = train(fabric, args)
    if args.then_launch:
        before = id(dist.group.WORLD)
        result["launch_returns"] = fabric.launch()
        result["launch_fn_returns"] = fabric.launch(
            lambda f, k: f.all_reduce(torch.tensor(k * (f.global_rank + 1)), reduce_op="sum").item(), 5
        )
        result["same_group"] = id(dist.group.WORLD) == before
    emit("RESULT " + json.dumps(result))


if __name__ == "__main__":
    main()
