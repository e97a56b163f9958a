"""The loop of examples/plain_loop.py converted to fabric_lite: every added or changed line says ``# fabric_lite``.

    python examples/fabric_loop.py                       # two CPU processes (DDP; the script re-runs itself)
    python examples/fabric_loop.py --devices 1           # one process: the same losses as plain_loop.py
    python examples/fabric_loop.py --epochs 2            # a short run
    torchrun --nproc-per-node 2 examples/fabric_loop.py  # two processes started by torchrun
    fabric-lite run --devices 2 examples/fabric_loop.py  # the same through fabric_lite's command line
    diff examples/plain_loop.py examples/fabric_loop.py  # the conversion, line by line

With one process the printed losses equal plain_loop.py's to the last digit: the same seed, the same data order,
the same arithmetic. With two, each process trains on half of every epoch (batches of ``--batch-size`` each, so
the global batch doubles) and the printed loss is the mean over both processes.
"""

from __future__ import annotations

import argparse
import os

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from fabric_lite import Fabric  # fabric_lite


def make_data(n: int = 2048, dim: int = 8, seed: int = 0) -> TensorDataset:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(n, dim, generator=generator)
    w = torch.randn(dim, 1, generator=generator)
    y = torch.sin(x @ w / dim**0.5) + 0.1 * torch.randn(n, 1, generator=generator)
    return TensorDataset(x, y)


def train(fabric: Fabric, epochs: int, batch_size: int, checkpoint: str | None) -> None:  # fabric_lite
    fabric.seed_everything(42)  # fabric_lite: torch, random and numpy, on every process
    model = nn.Sequential(nn.Linear(8, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 1))
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    model, optimizer = fabric.setup(model, optimizer)  # fabric_lite: to the device, and into DDP with several
    loader = fabric.setup_dataloaders(DataLoader(make_data(), batch_size=batch_size, shuffle=True))  # fabric_lite

    fabric.print(f"training on {fabric.world_size} process(es)")  # fabric_lite: printed by rank 0 only
    for epoch in range(epochs):
        total = torch.zeros((), device=fabric.device)  # fabric_lite
        for x, y in loader:
            # fabric_lite: no x.to(device), the batches arrive on fabric.device
            loss = nn.functional.mse_loss(model(x), y)
            optimizer.zero_grad()
            fabric.backward(loss)  # fabric_lite: instead of loss.backward()
            optimizer.step()
            total += loss.detach()
        mean = fabric.all_reduce(total / len(loader), reduce_op="mean")  # fabric_lite: over every process
        fabric.print(f"epoch {epoch + 1} loss {mean.item():.6f}")  # fabric_lite
    if checkpoint:
        fabric.save(checkpoint, {"model": model})  # fabric_lite: rank 0 writes it, atomically


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--accelerator", default="cpu")  # fabric_lite: instead of --device
    parser.add_argument("--devices", default=None, help="processes or GPUs; default 2, or torchrun's")  # fabric_lite
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--checkpoint", default=None, help="where to save the weights at the end (default: nowhere)")
    args = parser.parse_args()
    launched = "TORCHELASTIC_RUN_ID" in os.environ  # fabric_lite: torchrun or fabric-lite run started the processes
    devices = args.devices if args.devices is not None else ("auto" if launched else 2)  # fabric_lite
    fabric = Fabric(accelerator=args.accelerator, devices=devices)  # fabric_lite
    fabric.launch()  # fabric_lite: this process is rank 0 and starts the others (none under torchrun)
    train(fabric, args.epochs, args.batch_size, args.checkpoint)  # fabric_lite


if __name__ == "__main__":
    main()
