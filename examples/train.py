"""Train a small classifier with fabric_lite: the plain PyTorch loop plus five lines.

    python examples/train.py                       # two CPU processes with DDP (the script re-runs itself)
    python examples/train.py --devices 1           # one process
    python examples/train.py --strategy ddp_spawn  # two processes started with torch.multiprocessing
    torchrun --nproc-per-node 2 examples/train.py  # two processes started by torchrun

The data is generated: points in 16 dimensions labelled by a fixed random "teacher" network, so the student
can learn it and the loss visibly goes down. Every process sees its own shard of the data; the printed loss and
accuracy are averaged over all processes with one ``all_reduce``. A checkpoint is written at the end.
"""

from __future__ import annotations

import argparse
import os
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from fabric_lite import Fabric


def make_data(n: int = 4096, dim: int = 16, classes: int = 4, seed: int = 0) -> TensorDataset:
    generator = torch.Generator().manual_seed(seed)
    teacher = nn.Sequential(nn.Linear(dim, 32), nn.Tanh(), nn.Linear(32, classes))
    for p in teacher.parameters():
        nn.init.normal_(p, std=1.0, generator=generator)
    x = torch.randn(n, dim, generator=generator)
    with torch.no_grad():
        y = teacher(x).argmax(dim=1)
    return TensorDataset(x, y)


def train(fabric: Fabric, epochs: int, batch_size: int, checkpoint: str | None) -> float:
    fabric.seed_everything(42)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 4))
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    model, optimizer = fabric.setup(model, optimizer)  # <- fabric_lite
    loader = DataLoader(make_data(), batch_size=batch_size, shuffle=True)
    loader = fabric.setup_dataloaders(loader)  # <- fabric_lite: each process gets its shard

    fabric.print(f"training on {fabric.world_size} process(es), strategy {type(fabric.strategy).__name__}")
    metrics = {}
    for epoch in range(epochs):
        start = time.perf_counter()
        total_loss = torch.zeros((), device=fabric.device)
        correct = torch.zeros((), device=fabric.device)
        seen = 0
        for x, y in loader:
            logits = model(x)
            loss = nn.functional.cross_entropy(logits, y)
            optimizer.zero_grad()
            fabric.backward(loss)  # <- fabric_lite, instead of loss.backward()
            optimizer.step()
            total_loss += loss.detach() * len(y)
            correct += (logits.argmax(dim=1) == y).sum()
            seen += len(y)
        # one collective for all the metrics of the epoch
        metrics = fabric.all_reduce(
            {"loss": total_loss / seen, "accuracy": correct / seen}, reduce_op="mean"
        )  # <- fabric_lite
        fabric.print(
            f"epoch {epoch + 1:2d}/{epochs}  loss {metrics['loss'].item():.4f}"
            f"  accuracy {metrics['accuracy'].item():.3f}  ({time.perf_counter() - start:.2f} s)"
        )
    if checkpoint:
        fabric.save(checkpoint, {"model": model, "optimizer": optimizer, "epoch": epochs})
        fabric.print(f"saved {checkpoint}")
    return float(metrics["loss"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--accelerator", default="cpu")
    parser.add_argument("--devices", default=None, help="processes (CPU) or GPUs; default 2, or torchrun's")
    parser.add_argument("--strategy", default="ddp")
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--checkpoint", default=os.path.join("checkpoints", "example.ckpt"))
    args = parser.parse_args()
    devices = args.devices if args.devices is not None else ("auto" if "TORCHELASTIC_RUN_ID" in os.environ else 2)

    fabric = Fabric(accelerator=args.accelerator, devices=devices, strategy=args.strategy)
    if args.strategy in ("ddp_spawn", "ddp_fork"):
        final = fabric.launch(train, args.epochs, args.batch_size, args.checkpoint)  # runs in new processes
        print(f"final loss {final:.4f}")
    else:
        fabric.launch()  # with "ddp", this process is rank 0 and starts the others by re-running this script
        train(fabric, args.epochs, args.batch_size, args.checkpoint)


if __name__ == "__main__":
    main()
