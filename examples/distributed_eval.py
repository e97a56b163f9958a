"""Distributed evaluation with exact metrics: every sample counted once, however the data splits.

    python examples/distributed_eval.py                   # two CPU processes (DDP), 83 evaluation samples
    python examples/distributed_eval.py --epochs 1        # a short run
    python examples/distributed_eval.py --devices 3 --samples 100
    torchrun --nproc-per-node 2 examples/distributed_eval.py

``DistributedSampler`` gives every process the same number of samples: when the dataset does not divide by the
number of processes it repeats its first samples to fill up (83 samples on 2 processes: 42 each, sample 0
twice). A metric computed from a plain ``all_gather`` of every batch counts those repeats, so it is computed over
84 samples, not 83. ``fabric.gather_for_metrics`` gathers the per-sample results of each batch from every
process and drops the repeats, so the metric sees each of the 83 samples exactly once and equals what one process
computes over the whole set. The script trains a small classifier for a few epochs, evaluates it both ways and
prints how many samples each metric saw.
"""

from __future__ import annotations

import argparse
import os

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from fabric_lite import Fabric
from fabric_lite.utilities import progress_bar


def make_data(n: int, seed: int, dim: int = 10, classes: int = 3) -> TensorDataset:
    """``(x, label, index)`` triples; the index tells which samples a metric saw."""
    generator = torch.Generator().manual_seed(seed)
    centers = torch.randn(classes, dim, generator=torch.Generator().manual_seed(1234)) * 1.5
    y = torch.randint(0, classes, (n,), generator=generator)
    x = centers[y] + torch.randn(n, dim, generator=generator)
    return TensorDataset(x, y, torch.arange(n))


def train(fabric: Fabric, model: nn.Module, epochs: int) -> nn.Module:
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    model, optimizer = fabric.setup(model, optimizer)
    loader = fabric.setup_dataloaders(DataLoader(make_data(1024, seed=0), batch_size=32, shuffle=True))
    for epoch in range(epochs):
        for x, y, _ in progress_bar(loader, fabric=fabric, desc=f"train epoch {epoch + 1}"):
            loss = nn.functional.cross_entropy(model(x), y)
            optimizer.zero_grad()
            fabric.backward(loss)
            optimizer.step()
    return model


@torch.no_grad()
def evaluate(fabric: Fabric, model: nn.Module, samples: int, batch_size: int) -> None:
    model.eval()
    dataset = make_data(samples, seed=1)
    loader = fabric.setup_dataloaders(DataLoader(dataset, batch_size=batch_size))
    fabric.print(
        f"evaluating {samples} samples on {fabric.world_size} process(es):"
        f" {len(loader)} batches of up to {batch_size} per process"
    )
    exact: dict[str, list[torch.Tensor]] = {"index": [], "correct": [], "loss": []}
    naive: dict[str, list[torch.Tensor]] = {"index": [], "correct": [], "loss": []}
    for x, y, index in progress_bar(loader, fabric=fabric, desc="eval"):
        logits = model(x)
        results = {
            "index": index,
            "correct": (logits.argmax(dim=1) == y).float(),
            "loss": nn.functional.cross_entropy(logits, y, reduction="none"),
        }
        # exact: every process's rows of this batch, without the samples the sampler repeated to fill up
        for key, value in fabric.gather_for_metrics(results).items():
            exact[key].append(value)
        # naive: all_gather keeps the repeats ((world_size, batch) -> one row per gathered sample)
        for key, value in fabric.all_gather(results).items():
            naive[key].append(value.reshape(-1) if fabric.world_size > 1 else value)

    for name, parts in (("gather_for_metrics", exact), ("naive all_gather", naive)):
        index = torch.cat(parts["index"])
        seen = len(index)
        repeated = seen - len(index.unique())
        accuracy = torch.cat(parts["correct"]).mean().item()
        loss = torch.cat(parts["loss"]).mean().item()
        fabric.print(
            f"{name:>18}: {seen} samples seen ({repeated} counted twice)  accuracy {accuracy:.4f}  loss {loss:.4f}"
        )

    # the reference: one process over the whole set, no sampler at all
    if fabric.is_global_zero:
        x, y, _ = dataset.tensors
        logits = model.module(x.to(fabric.device))  # the plain module: no DDP collective on a single rank
        y = y.to(fabric.device)
        accuracy = (logits.argmax(dim=1) == y).float().mean().item()
        loss = nn.functional.cross_entropy(logits, y).item()
        print(f"{'one process':>18}: {len(y)} samples seen (0 counted twice)  accuracy {accuracy:.4f}  loss {loss:.4f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--accelerator", default="cpu")
    parser.add_argument("--devices", default=None, help="processes (CPU) or GPUs; default 2, or torchrun's")
    parser.add_argument("--epochs", type=int, default=3, help="training epochs before the evaluation")
    parser.add_argument("--samples", type=int, default=83, help="evaluation samples (not a multiple of 2 or 3)")
    parser.add_argument("--batch-size", type=int, default=8, help="evaluation batch size per process")
    args = parser.parse_args()
    launched = "TORCHELASTIC_RUN_ID" in os.environ  # torchrun or fabric-lite run started the processes
    devices = args.devices if args.devices is not None else ("auto" if launched else 2)
    fabric = Fabric(accelerator=args.accelerator, devices=devices)
    fabric.launch()
    fabric.seed_everything(0)
    model: nn.Module = nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 3))
    model = train(fabric, model, args.epochs)
    evaluate(fabric, model, args.samples, args.batch_size)


if __name__ == "__main__":
    main()
