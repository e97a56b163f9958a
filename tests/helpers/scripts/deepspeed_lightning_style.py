"""A Lightning Fabric training script with DeepSpeed, written as Lightning's users write one:
tests/tiers/deepspeed/test_deepspeed.py runs it under fabric_lite with only the import line changed (``from
lightning.fabric import Fabric`` becomes
``from fabric_lite import Fabric``).

    fabric-lite run --accelerator cpu --devices 2 --strategy deepspeed_stage_2 --precision bf16-mixed \\
        SCRIPT OUT_FOLDER

(Lightning Fabric itself refuses to run DeepSpeed on anything but CUDA GPUs.) Rank 0 prints ``RESULT {json}``.
"""

import json
import sys

import torch
import torch.nn.functional as F
from lightning.fabric import Fabric
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def main() -> None:
    out = sys.argv[1]
    fabric = Fabric(accelerator="auto", devices=2, strategy="deepspeed_stage_2", precision="bf16-mixed")
    fabric.launch()
    fabric.seed_everything(42)

    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model, optimizer = fabric.setup(model, optimizer)

    generator = torch.Generator().manual_seed(0)
    inputs = torch.randn(256, 16, generator=generator)
    targets = (inputs[:, :4].argmax(dim=1)).long()
    loader = fabric.setup_dataloaders(DataLoader(TensorDataset(inputs, targets), batch_size=16, shuffle=True))

    losses = []
    for epoch in range(3):
        for x, y in loader:
            loss = F.cross_entropy(model(x), y)
            fabric.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
        epoch_loss = fabric.all_reduce(loss.detach(), reduce_op="mean")
        losses.append(round(epoch_loss.item(), 4))
        fabric.print(f"epoch {epoch}: loss {epoch_loss.item():.4f}")

    state = {"model": model, "optimizer": optimizer, "epoch": 3}
    fabric.save(f"{out}/checkpoint", state)
    state["epoch"] = 0
    fabric.load(f"{out}/checkpoint", state)

    with torch.no_grad():
        accuracy = (model(inputs).argmax(dim=1) == targets).float().mean().item()
    if fabric.global_rank == 0:
        print(
            "RESULT "
            + json.dumps(
                {
                    "losses": losses,
                    "epoch": state["epoch"],
                    "accuracy": accuracy,
                    "world_size": fabric.world_size,
                    "strategy": type(fabric.strategy).__name__,
                }
            )
        )


if __name__ == "__main__":
    main()
