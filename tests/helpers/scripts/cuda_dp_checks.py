"""CUDA checks of ``strategy="dp"``, one process each (run by tests/unit/test_dp.py on a machine with a GPU).

    python tests/helpers/scripts/cuda_dp_checks.py CHECK [cpu]

prints ``RESULT {json}``. ``cpu`` runs the same loop with a ``DataParallelStrategy`` instance on the CPU (where
``DataParallel`` calls the module directly), so that the script itself is exercised on machines without a GPU.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from fabric_lite import Fabric
from fabric_lite.strategies import DataParallelStrategy


def emit(result: dict) -> None:
    os.write(1, ("RESULT " + json.dumps(result) + "\n").encode())


def _data() -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    return TensorDataset(torch.randn(64, 4, generator=g), torch.randn(64, 1, generator=g))


def _train(fabric: Fabric) -> tuple[nn.Module, list[float], dict]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    model, optimizer = fabric.setup(model, optimizer)
    loader = fabric.setup_dataloaders(DataLoader(_data(), batch_size=16))
    losses, seen = [], {"batch_devices": set(), "output_devices": set()}
    for _ in range(3):
        for x, y in loader:
            seen["batch_devices"].add(str(x.device))
            out = model(x)
            seen["output_devices"].add(str(out.device))
            loss = nn.functional.mse_loss(out, y)
            optimizer.zero_grad()
            fabric.backward(loss)
            optimizer.step()
            losses.append(loss.item())
    return model, losses, {k: sorted(v) for k, v in seen.items()}


def _params(model: nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1).cpu() for p in model.parameters()])


def dp_one_device(accelerator: str) -> dict:
    """A training loop with strategy="dp" on one device, against the single-device strategy on the same data."""
    strategy = "dp" if accelerator == "cuda" else DataParallelStrategy()
    fabric = Fabric(accelerator=accelerator, devices=1, strategy=strategy)
    model, losses, seen = _train(fabric)
    reference = Fabric(accelerator=accelerator, devices=1, strategy="single_device")
    ref_model, ref_losses, _ = _train(reference)
    # a per-replica value, as DataParallel gathers it: one element per device
    per_replica = torch.tensor([1.0, 3.0], device=fabric.device)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "ckpt.pt")
        fabric.save(path, {"model": model})
        keys = sorted(torch.load(path, weights_only=True)["model"])
        restored = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
        fabric.load(path, {"model": restored})
        # and back into the DataParallel-wrapped module, through the strategy (no "module." prefix expected)
        fabric.strategy.load_module_state_dict(model._forward_module, restored.state_dict())
    return {
        "strategy": type(fabric.strategy).__name__,
        "wrapper": type(model._forward_module).__name__,
        "device": str(fabric.device),
        "param_devices": sorted({str(p.device) for p in model.parameters()}),
        "batch_devices": seen["batch_devices"],
        "output_devices": seen["output_devices"],
        "loss_went_down": losses[-1] < losses[0],
        "same_as_single_device": bool(torch.equal(_params(model), _params(ref_model))) and losses == ref_losses,
        "mean": fabric.all_reduce(per_replica).item(),
        "sum": fabric.all_reduce({"x": per_replica}, reduce_op="sum")["x"].item(),
        "checkpoint_keys": keys,
        "restored_equal": bool(torch.equal(_params(restored), _params(model))),
    }


def dp_every_device(accelerator: str) -> dict:
    """With every GPU (two or more): the batch is split across them and gathered on cuda:0."""
    count = torch.cuda.device_count() if accelerator == "cuda" else 1
    strategy = "dp" if accelerator == "cuda" else DataParallelStrategy()
    fabric = Fabric(accelerator=accelerator, devices=-1 if accelerator == "cuda" else 1, strategy=strategy)
    model, losses, seen = _train(fabric)
    ref_model, ref_losses, _ = _train(Fabric(accelerator=accelerator, devices=1, strategy="single_device"))
    replicas: list[str] = []
    inner = model.module
    handle = inner.register_forward_hook(lambda m, i, o: replicas.append(str(o.device)))
    model(torch.randn(8, 4, device=fabric.device))
    handle.remove()
    return {
        "count": count,
        "devices": [str(d) for d in fabric.strategy.parallel_devices],
        "replica_devices": sorted(set(replicas)),
        "output_devices": seen["output_devices"],
        "loss_went_down": losses[-1] < losses[0],
        "max_diff_to_single_device": float((_params(model) - _params(ref_model)).abs().max()),
    }


def dp_cpu_devices_with_cuda(accelerator: str) -> dict:
    strategy = DataParallelStrategy(parallel_devices=[torch.device("cpu")])
    try:
        strategy.setup_module(nn.Linear(2, 2))
    except ValueError as err:
        return {"raised": "ValueError", "message": str(err)}
    return {"raised": None}


CHECKS = {"dp_one_device": dp_one_device, "dp_every_device": dp_every_device, "cpu_devices": dp_cpu_devices_with_cuda}


if __name__ == "__main__":
    emit(CHECKS[sys.argv[1]]("cpu" if sys.argv[2:] == ["cpu"] else "cuda"))
