"""Training jobs for the DDP parity tests, and the shared model/data so the raw-PyTorch reference is identical."""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

STEPS = 10
BATCH = 8


def make_model() -> nn.Module:
    return nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 3))


def make_dataset(n: int = 96) -> TensorDataset:
    g = torch.Generator().manual_seed(1234)
    x = torch.randn(n, 6, generator=g)
    y = torch.randn(n, 3, generator=g)
    return TensorDataset(x, y)


def flat_grads(module: nn.Module) -> list[float]:
    return torch.cat([p.grad.reshape(-1) for p in module.parameters()]).tolist()


def flat_params(module: nn.Module) -> list[float]:
    return torch.cat([p.detach().reshape(-1) for p in module.parameters()]).tolist()


def fabric_ddp_train(fabric) -> dict:
    """10 SGD steps with fabric_lite; returns losses, per-step gradients, batches and final parameters."""
    fabric.seed_everything(0)
    model = make_model()
    initial = flat_params(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model, optimizer = fabric.setup(model, optimizer)
    loader = fabric.setup_dataloaders(DataLoader(make_dataset(), batch_size=BATCH, shuffle=True))
    losses, grads, batches = [], [], []
    step = 0
    while step < STEPS:
        for x, y in loader:
            loss = nn.functional.mse_loss(model(x), y)
            optimizer.zero_grad()
            fabric.backward(loss)
            grads.append(flat_grads(model))
            optimizer.step()
            losses.append(loss.item())
            batches.append((x.tolist(), y.tolist()))
            step += 1
            if step == STEPS:
                break
    return {"initial": initial, "losses": losses, "grads": grads, "batches": batches, "params": flat_params(model)}


def micro_batch(rank: int, micro: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(100 * rank + micro)
    return torch.randn(4, 6, generator=g), torch.randn(4, 3, generator=g)


def fabric_accumulate(fabric, micro_batches: int = 3) -> dict:
    """Accumulate gradients over micro-batches; only the last backward synchronises."""
    fabric.seed_everything(0)
    model = make_model()
    initial = flat_params(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = fabric.setup(model, optimizer)
    inside = []
    for micro in range(micro_batches):
        last = micro == micro_batches - 1
        with fabric.no_backward_sync(model, enabled=not last):
            x, y = micro_batch(fabric.global_rank, micro)
            loss = nn.functional.mse_loss(model(x), y)
            fabric.backward(loss)
        if not last:
            inside.append(flat_grads(model))
    return {"initial": initial, "inside": inside, "final": flat_grads(model)}
