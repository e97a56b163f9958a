"""A script for `fabric-lite run --strategy=fsdp` (tests/distributed/test_cli.py): train a small model sharded over the
ranks, save a sharded checkpoint folder with `fabric.save`, and have rank 0 save the whole state as torch's own API
gathers it, to compare with what `fabric-lite consolidate` makes of the folder.

    fabric-lite run --accelerator=cpu --devices=2 --strategy=fsdp tests/helpers/scripts/fsdp_save.py OUT_FOLDER
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

from fabric_lite import Fabric


def main() -> None:
    out = Path(sys.argv[1])
    fabric = Fabric()  # every setting from the command line; no launch(): the CLI started the processes
    torch.manual_seed(0)
    model = fabric.setup_module(nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 3)))
    optimizer = fabric.setup_optimizers(torch.optim.SGD(model.parameters(), lr=0.1))
    for step in range(3):
        g = torch.Generator().manual_seed(step)
        x = torch.randn(4, 6, generator=g) + fabric.global_rank  # each rank its own batch
        loss = nn.functional.mse_loss(model(x), torch.zeros(4, 3))
        optimizer.zero_grad()
        fabric.backward(loss)
        optimizer.step()
    fabric.save(out / "sharded", {"model": model, "optimizer": optimizer, "step": 3})
    expected = get_model_state_dict(model.module, options=StateDictOptions(full_state_dict=True))
    if fabric.global_rank == 0:
        torch.save({k: v.detach().clone() for k, v in expected.items()}, out / "expected.pt")
    fabric.barrier()


if __name__ == "__main__":
    main()
