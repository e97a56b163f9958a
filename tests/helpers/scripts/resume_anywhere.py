"""Train 3 epochs and checkpoint every 2nd optimizer step; started again, resume from the last checkpoint.

    python tests/helpers/scripts/resume_anywhere.py --devices 2 --out final.pt --checkpoint last.ckpt [--impl lightning]

Everything that makes a resume hard at once: shuffling, a loader with 2 workers, dropout, gradient accumulation
(2 batches a step, without gradient sync on the first), an LR scheduler and ``bf16-mixed``. Prints ``STEP n``
after each optimizer step and ``RESUMED step=n epoch=e`` after loading. Used by
tests/distributed/test_resume_anywhere.py, which kills the job with SIGKILL at a random step and checks that the
resumed run ends with exactly the weights and optimizer state of one that never stopped; with ``--impl
lightning`` the same script runs on Lightning Fabric (tests/compat), whose loader restarts the epoch.
"""

from __future__ import annotations

import argparse
import os
import random

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

EPOCHS = 3
ACCUMULATE = 2
SAMPLES = 384
BATCH = 8


class GeneratorStates:
    """This process's random generators, for Lightning Fabric, which has no ``RandomState`` (one process only)."""

    def state_dict(self) -> dict[str, object]:
        return {"torch": torch.get_rng_state(), "python": random.getstate(), "numpy": np.random.get_state()}

    def load_state_dict(self, state: dict[str, object]) -> None:
        torch.set_rng_state(state["torch"])  # type: ignore[arg-type]
        random.setstate(state["python"])  # type: ignore[arg-type]
        np.random.set_state(state["numpy"])  # type: ignore[arg-type]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--out", required=True)
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--impl", choices=("fabric_lite", "lightning"), default="fabric_lite")
    args = parser.parse_args()
    torch.set_num_threads(1)  # several CPU threads make a backward differ in its last bits from run to run

    if args.impl == "lightning":
        from lightning_fabric import Fabric

        rng: object = GeneratorStates()
    else:
        from fabric_lite import Fabric
        from fabric_lite.utilities import RandomState

        rng = RandomState()

    fabric = Fabric(accelerator="cpu", devices=args.devices, strategy="ddp", precision="bf16-mixed")
    fabric.launch()
    fabric.seed_everything(7)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Dropout(0.2), nn.Linear(64, 4))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / 10))
    model, optimizer = fabric.setup(model, optimizer)
    g = torch.Generator().manual_seed(3)
    data = TensorDataset(torch.randn(SAMPLES, 16, generator=g), torch.randint(0, 4, (SAMPLES,), generator=g))
    loader = fabric.setup_dataloaders(DataLoader(data, batch_size=BATCH, shuffle=True, num_workers=2))
    state = {"model": model, "optimizer": optimizer, "scheduler": scheduler, "rng": rng, "loader": loader}
    state.update(epoch=0, step=0)

    if os.path.exists(args.checkpoint):
        # Lightning saves the loader and the NumPy state as pickled objects: it reads them back only unsafely
        fabric.load(args.checkpoint, state, **({"weights_only": False} if args.impl == "lightning" else {}))
        fabric.print(f"RESUMED step={state['step']} epoch={state['epoch']}", flush=True)
    for epoch in range(state["epoch"], EPOCHS):  # type: ignore[arg-type]
        state["epoch"] = epoch
        for i, (x, y) in enumerate(loader):
            accumulating = (i + 1) % ACCUMULATE != 0
            with fabric.no_backward_sync(model, enabled=accumulating):
                loss = nn.functional.cross_entropy(model(x), y)
                fabric.backward(loss / ACCUMULATE)
            if accumulating:
                continue
            optimizer.step()
            optimizer.zero_grad()
            scheduler.step()
            state["step"] += 1  # type: ignore[operator]
            fabric.print(f"STEP {state['step']}", flush=True)
            if state["step"] % 2 == 0:  # type: ignore[operator]
                fabric.save(args.checkpoint, state)
    if fabric.global_rank == 0:
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, args.out)


if __name__ == "__main__":
    main()
