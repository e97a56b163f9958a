"""Checkpoints of ModelParallelStrategy, Lightning Fabric's and fabric_lite's, loaded by the other.

    COMPAT_IMPL=fabric_lite|lightning python tests/helpers/scripts/model_parallel_compat.py save|load CHECKPOINT

Two ranks, tensor parallel (a column-wise then a row-wise Linear). ``save`` trains three steps and saves the model,
the optimizer and plain entries; ``load`` loads them into a fresh model. Both print ``OBS`` with what they hold.
"""

from __future__ import annotations

import json
import os
import sys

import torch
from torch import nn

if os.environ.get("COMPAT_IMPL") == "lightning":
    from lightning_fabric import Fabric
    from lightning_fabric.strategies import ModelParallelStrategy
else:
    from fabric_lite import Fabric
    from fabric_lite.strategies import ModelParallelStrategy


def parallelize(model: nn.Module, device_mesh: object) -> nn.Module:
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    return parallelize_module(model, device_mesh["tensor_parallel"], {"0": ColwiseParallel(), "2": RowwiseParallel()})


def full(model: nn.Module) -> dict[str, list[float]]:
    state = {}
    for name, param in model.named_parameters():
        value = param.full_tensor() if hasattr(param, "full_tensor") else param
        state[name.replace("_forward_module.", "")] = [round(v, 6) for v in value.detach().flatten().tolist()]
    return state


def main() -> None:
    mode, path = sys.argv[1], sys.argv[2]
    strategy = ModelParallelStrategy(parallelize, data_parallel_size=1, tensor_parallel_size=2)
    fabric = Fabric(accelerator="cpu", devices=2, strategy=strategy)
    fabric.launch()
    torch.manual_seed(0)
    model = fabric.setup(nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2)))
    optimizer = fabric.setup_optimizers(torch.optim.Adam(model.parameters(), lr=0.1))
    if mode == "save":
        for step in range(3):
            x = torch.arange(8.0).reshape(2, 4) + step
            loss = model(x).pow(2).sum()
            fabric.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
        fabric.save(path, {"model": model, "optimizer": optimizer, "step": 3, "note": "hello"})
        state: dict[str, object] = {"step": 3, "note": "hello"}
    else:
        state = {"model": model, "optimizer": optimizer, "step": 0, "note": ""}
        fabric.load(path, state)
        state = {"step": state["step"], "note": state["note"]}
    # one more identical step shows the optimizer state (Adam's moments) came along
    loss = model(torch.ones(2, 4)).pow(2).sum()
    fabric.backward(loss)
    optimizer.step()
    fabric.print("OBS " + json.dumps({"model": full(model), **state}))


if __name__ == "__main__":
    main()
