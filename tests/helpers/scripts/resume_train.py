"""Train 3 epochs with dropout, shuffling and Adam, checkpointing after every epoch; resume from the checkpoint.

    python tests/helpers/scripts/resume_train.py --out final.pt --checkpoint last.ckpt [--stop-after 1] [--kill-rank 1]

Used by tests/distributed/test_resume.py to show that a resumed run ends with exactly the weights of one that never
stopped: after a clean stop and restart, and under torchrun --max-restarts after a rank was killed.
"""

from __future__ import annotations

import argparse
import os
import signal

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from fabric_lite import Fabric
from fabric_lite.utilities import RandomState

EPOCHS = 3


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--stop-after", type=int, default=-1, help="exit cleanly after this epoch (0-based)")
    parser.add_argument("--kill-rank", type=int, default=-1, help="SIGKILL this rank once, in epoch 1")
    args = parser.parse_args()

    fabric = Fabric(accelerator="cpu", devices=2, strategy="ddp")
    fabric.launch()
    fabric.seed_everything(1234)
    model = nn.Sequential(nn.Linear(6, 32), nn.ReLU(), nn.Dropout(0.3), nn.Linear(32, 2))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    model, optimizer = fabric.setup(model, optimizer)
    g = torch.Generator().manual_seed(5)
    data = TensorDataset(torch.randn(64, 6, generator=g), torch.randint(0, 2, (64,), generator=g))
    loader = fabric.setup_dataloaders(DataLoader(data, batch_size=8, shuffle=True))
    state = {"model": model, "optimizer": optimizer, "rng": RandomState(), "loader": loader, "epoch": -1}

    if os.path.exists(args.checkpoint):
        fabric.load(args.checkpoint, state)
    first_attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"
    for epoch in range(state["epoch"] + 1, EPOCHS):
        for step, (x, y) in enumerate(loader):
            if epoch == 1 and step == 2 and fabric.global_rank == args.kill_rank and first_attempt:
                os.kill(os.getpid(), signal.SIGKILL)
            loss = nn.functional.cross_entropy(model(x), y)
            optimizer.zero_grad()
            fabric.backward(loss)
            optimizer.step()
        state["epoch"] = epoch
        fabric.save(args.checkpoint, state)
        if epoch == args.stop_after:
            return
    if fabric.global_rank == 0:
        torch.save({k: v.clone() for k, v in model.state_dict().items()}, args.out)


if __name__ == "__main__":
    main()
