"""A training job that saves mid-epoch and one that resumes from that checkpoint, written against both libraries:
a checkpoint of Lightning Fabric's must resume on fabric_lite with the same next losses, and the other way round
(tests/compat/test_checkpoint_interchange.py).

    COMPAT_IMPL=lightning|fabric_lite python tests/helpers/scripts/checkpoint_interchange.py LAYOUT MODE CHECKPOINT...

LAYOUT: ``ddp`` (two processes, DDP, one checkpoint file) or ``sharded`` (two processes, the model sharded with
``fully_shard``, a checkpoint folder: fabric_lite's ``FSDPStrategy``, and Lightning's ``ModelParallelStrategy`` with a
data-parallel mesh, since Lightning refuses ``FSDPStrategy`` on the CPU). MODE: ``save`` trains steps 1-5, saves, and
goes on to step 9; ``resume`` loads the checkpoint into a fresh job and trains steps 6-9. Both print ``OBS`` with the
losses of steps 6-9 (averaged over the ranks) and the final weights. With several checkpoints, each is a job of its
own (a new Fabric, model, optimizer and loader), one after another in the same two processes.

The state holds everything Lightning saves: the module, the optimizer, an LR scheduler, a loader with its own
``state_dict`` (it resumes mid-epoch) and plain values.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import torch
from torch import nn
from torch.utils.data import TensorDataset

from tests.helpers.resumable import ResumableLoader

if os.environ.get("COMPAT_IMPL") == "lightning":
    from lightning_fabric import Fabric
    from lightning_fabric.strategies import FSDPStrategy, ModelParallelStrategy
else:
    from fabric_lite import Fabric
    from fabric_lite.strategies import FSDPStrategy, ModelParallelStrategy

SAVE_AT, STEPS = 5, 9


def shard(model: nn.Module, device_mesh: Any) -> nn.Module:
    from torch.distributed.fsdp import fully_shard

    mesh = device_mesh["data_parallel"]
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)
    return fully_shard(model, mesh=mesh)


def full(model: nn.Module) -> dict[str, list[float]]:
    state = {}
    for name, param in model.named_parameters():
        value = param.full_tensor() if hasattr(param, "full_tensor") else param
        state[name.replace("_forward_module.", "")] = value.detach().flatten().tolist()
    return state


def run(layout: str, mode: str, path: str) -> None:
    if layout == "ddp":
        strategy: Any = "ddp"
    elif os.environ.get("COMPAT_IMPL") == "lightning":
        strategy = ModelParallelStrategy(shard, data_parallel_size=2, tensor_parallel_size=1)
    else:
        strategy = FSDPStrategy()
    fabric = Fabric(accelerator="cpu", devices=2, strategy=strategy)
    fabric.launch()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 1))
    if layout == "ddp":
        model, optimizer = fabric.setup(model, torch.optim.Adam(model.parameters(), lr=0.05))
    else:  # sharded: the optimizer over the sharded parameters
        model = fabric.setup_module(model)
        optimizer = fabric.setup_optimizers(torch.optim.Adam(model.parameters(), lr=0.05))
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
    data = TensorDataset(torch.linspace(-1, 1, 64).reshape(16, 4), torch.linspace(0, 1, 16).reshape(16, 1))
    loader = fabric.setup_dataloaders(ResumableLoader(data, batch_size=2, shuffle=True))
    state: dict[str, Any] = {"model": model, "optimizer": optimizer, "scheduler": scheduler, "loader": loader}
    state.update(step=0, note="")
    if mode == "resume":
        fabric.load(path, state)
    losses = []
    while state["step"] < STEPS:
        for x, y in loader:
            loss = (model(x) - y).pow(2).mean()
            optimizer.zero_grad()
            fabric.backward(loss)
            optimizer.step()
            scheduler.step()
            state["step"] += 1
            if state["step"] > SAVE_AT:
                losses.append(fabric.all_reduce(loss.detach(), reduce_op="mean").item())
            if mode == "save" and state["step"] == SAVE_AT:
                state["note"] = "mid-epoch"
                fabric.save(path, state)
            if state["step"] == STEPS:
                break
    observed = {"losses": losses, "model": full(model), "lr": scheduler.get_last_lr(), "note": state["note"]}
    fabric.print("OBS " + json.dumps(observed))


def main() -> None:
    layout, mode, *paths = sys.argv[1:]
    for path in paths:  # each a job of its own: a later Fabric joins the processes the first one started
        run(layout, mode, path)


if __name__ == "__main__":
    main()
