"""Gradient accumulation with ``fabric.no_backward_sync``: four small batches, one optimizer step, one all-reduce.

    python examples/grad_accumulation.py                        # two CPU processes (DDP)
    python examples/grad_accumulation.py --steps 5              # a short run
    python examples/grad_accumulation.py --accumulate 8 --micro-batch 4
    torchrun --nproc-per-node 2 examples/grad_accumulation.py

Two copies of the same model train side by side on the same samples. One takes ``--accumulate`` micro-batches
per optimizer step: their gradients add up locally inside ``fabric.no_backward_sync(model, enabled=...)``, and
only the last backward of each step, outside it, averages them across the processes. The other takes all those
samples as one big batch. The two end up with the same weights (up to float rounding, printed as the largest
difference), which is what accumulation is for: the big batch's step with the memory of a small one, and with
one gradient all-reduce per optimizer step instead of one per micro-batch.

On the first step the script also checks, with two or more processes, that the synchronisation really is
skipped: inside the context every process still has its own gradients, and after the last backward they agree.
"""

from __future__ import annotations

import argparse
import copy
import os

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from fabric_lite import Fabric


def make_data(n: int = 4096, dim: int = 16, seed: int = 0) -> TensorDataset:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(n, dim, generator=generator)
    y = (x[:, :4].sum(dim=1, keepdim=True) > 0).float() + 0.1 * torch.randn(n, 1, generator=generator)
    return TensorDataset(x, y)


def flat_grads(model: nn.Module) -> torch.Tensor:
    return torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])


def spread_across_processes(fabric: Fabric, values: torch.Tensor) -> float:
    """The largest difference between any process's ``values`` and rank 0's (0.0 when they all agree)."""
    gathered = fabric.all_gather(values)  # (world_size, n)
    return float((gathered - gathered[0]).abs().max())


def max_difference(a: nn.Module, b: nn.Module) -> float:
    return max((pa - pb).abs().max().item() for pa, pb in zip(a.parameters(), b.parameters(), strict=True))


def train(fabric: Fabric, steps: int, accumulate: int, micro_batch: int) -> float:
    fabric.seed_everything(7)
    accumulating = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 1))
    big_batch = copy.deepcopy(accumulating)  # the same initial weights
    accumulating_opt = torch.optim.SGD(accumulating.parameters(), lr=0.05, momentum=0.9)
    big_batch_opt = torch.optim.SGD(big_batch.parameters(), lr=0.05, momentum=0.9)
    accumulating, accumulating_opt = fabric.setup(accumulating, accumulating_opt)
    big_batch, big_batch_opt = fabric.setup(big_batch, big_batch_opt)
    loader = fabric.setup_dataloaders(DataLoader(make_data(), batch_size=micro_batch, shuffle=True, drop_last=True))

    fabric.print(
        f"{fabric.world_size} process(es) x {accumulate} micro-batches of {micro_batch} per optimizer step"
        f" = {fabric.world_size * accumulate * micro_batch} samples per step"
    )
    batches = iter(loader)
    for step in range(1, steps + 1):
        micro_batches = []
        for _ in range(accumulate):
            batch = next(batches, None)
            if batch is None:  # next epoch (the sampler reshuffles)
                batches = iter(loader)
                batch = next(batches)
            micro_batches.append(batch)

        # accumulate: no gradient sync until the last micro-batch; forward AND backward inside the context
        for i, (x, y) in enumerate(micro_batches):
            last = i == accumulate - 1
            with fabric.no_backward_sync(accumulating, enabled=not last):
                loss = nn.functional.mse_loss(accumulating(x), y)
                fabric.backward(loss / accumulate)  # the mean over the micro-batches, as one big batch would take
            if step == 1 and fabric.world_size > 1 and i == 0 and not last:
                spread = spread_across_processes(fabric, flat_grads(accumulating))
                fabric.print(f"step 1: inside no_backward_sync the processes' gradients differ by up to {spread:.3g}")
        if step == 1 and fabric.world_size > 1:
            spread = spread_across_processes(fabric, flat_grads(accumulating))
            fabric.print(f"step 1: after the synchronising backward they differ by {spread:.3g}")
        accumulating_opt.step()
        accumulating_opt.zero_grad()

        # the reference: every sample of the step in one batch, one backward
        x = torch.cat([x for x, _ in micro_batches])
        y = torch.cat([y for _, y in micro_batches])
        big_loss = nn.functional.mse_loss(big_batch(x), y)
        fabric.backward(big_loss)
        big_batch_opt.step()
        big_batch_opt.zero_grad()

        mean_loss = fabric.all_reduce(big_loss.detach(), reduce_op="mean")
        if step == 1 or step % 10 == 0 or step == steps:
            fabric.print(
                f"step {step:3d}  loss {mean_loss.item():.4f}"
                f"  max |accumulated - big batch| {max_difference(accumulating, big_batch):.2e}"
            )
    difference = max_difference(accumulating, big_batch)
    fabric.print(f"after {steps} steps the weights differ by at most {difference:.2e} (float rounding)")
    return difference


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--accelerator", default="cpu")
    parser.add_argument("--devices", default=None, help="processes (CPU) or GPUs; default 2, or torchrun's")
    parser.add_argument("--steps", type=int, default=30, help="optimizer steps")
    parser.add_argument("--accumulate", type=int, default=4, help="micro-batches per optimizer step")
    parser.add_argument("--micro-batch", type=int, default=8, help="samples per micro-batch and process")
    args = parser.parse_args()
    if args.accumulate < 1:
        parser.error(f"--accumulate {args.accumulate}: give 1 or more micro-batches per step")
    launched = "TORCHELASTIC_RUN_ID" in os.environ  # torchrun or fabric-lite run started the processes
    devices = args.devices if args.devices is not None else ("auto" if launched else 2)
    fabric = Fabric(accelerator=args.accelerator, devices=devices)
    fabric.launch()
    train(fabric, args.steps, args.accumulate, args.micro_batch)


if __name__ == "__main__":
    main()
