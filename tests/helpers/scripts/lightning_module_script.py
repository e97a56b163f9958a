"""A LightningModule trained by Fabric (tests/compat/test_lightning_module.py), run with the Lightning venv's
interpreter (pytorch_lightning installed) and either Fabric: `fabric_lite`'s or `lightning_fabric`'s.

    PYTHONPATH=. .venv-lightning/bin/python tests/helpers/scripts/lightning_module_script.py IMPL DEVICES ROOT

The module's `training_step` uses `self.log`, `self.log_dict`, `self.all_gather`, `self.fabric`, `self.logger`,
`self.loggers`, `self.trainer.*` and `self.optimizers()`; the loop steps through `self.optimizers()` and
`self.manual_backward`; `fabric.call(...)` reaches its `on_train_epoch_end` hook. Rank 0 logs to a CSVLogger
under ROOT; every rank prints `RESULT {json}`.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import pytorch_lightning as pl
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

IMPL, DEVICES, ROOT = sys.argv[1], int(sys.argv[2]), sys.argv[3]
if IMPL == "lightning":
    from lightning_fabric import Fabric
    from lightning_fabric.loggers import CSVLogger
else:
    from fabric_lite import Fabric
    from fabric_lite.loggers import CSVLogger


class LitRegression(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.layer = nn.Linear(3, 1)
        self.epoch_ends: list[int] = []
        self.checks: dict[str, Any] = {}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer(x)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = nn.functional.mse_loss(self(x), y)
        optimizer = self.optimizers()  # the one optimizer Fabric set up, not a list
        rank = self.fabric.global_rank
        gathered = self.all_gather(torch.tensor([float(rank + 1), float(batch_idx)]))
        self.log("loss", loss.detach())
        self.log_dict({"rank_sum": gathered[..., 0].sum(), "batch_idx": float(batch_idx)})
        self.logger.log_metrics({"direct": float(10 * batch_idx + 1)}, step=1000 + batch_idx)
        self.checks = {
            "optimizer_is_set_up": isinstance(optimizer, torch.optim.Optimizer) and hasattr(optimizer, "optimizer"),
            "gathered_shape": list(gathered.shape),
            "trainer_world_size": self.trainer.world_size,
            "trainer_global_rank": self.trainer.global_rank,
            "trainer_strategy_is_fabric_strategy": self.trainer.strategy is self.fabric.strategy,
            "loggers": len(self.loggers),
            "logger_is_fabric_logger": self.logger is self.fabric.logger,
            "device": str(self.device),
        }
        return loss

    def on_train_epoch_end(self) -> None:
        self.epoch_ends.append(self.fabric.global_rank)
        self.log("epoch_end", float(len(self.epoch_ends)))


def main() -> None:
    logger = CSVLogger(ROOT, name="lit")
    strategy = "ddp" if DEVICES > 1 else "auto"
    fabric = Fabric(accelerator="cpu", devices=DEVICES, strategy=strategy, loggers=logger)
    fabric.launch()
    module = LitRegression()
    model, optimizer = fabric.setup(module, module.configure_optimizers())
    g = torch.Generator().manual_seed(1)
    data = TensorDataset(torch.randn(16, 3, generator=g), torch.randn(16, 1, generator=g))
    loader = fabric.setup_dataloaders(DataLoader(data, batch_size=8 // DEVICES, shuffle=False))
    for _epoch in range(2):
        for batch_idx, batch in enumerate(loader):
            loss = model.training_step(batch, batch_idx)  # through DDP's forward, as Lightning routes it
            # (a backward inside training_step would run inside DDP's forward: Lightning's DDP refuses that)
            module.optimizers().zero_grad()
            module.manual_backward(loss)  # fabric.backward
            module.optimizers().step()
        fabric.call("on_train_epoch_end")
    fabric.logger.finalize("success")
    result = {
        "rank": fabric.global_rank,
        "fabric_attached": module.fabric is fabric,
        "fabric_optimizers": [o is optimizer for o in module._fabric_optimizers],
        "module_is_callback": any(c is module for c in fabric._callbacks),
        "epoch_ends": module.epoch_ends,
        "checks": module.checks,
        "weight": [round(v, 6) for v in module.layer.weight.detach().flatten().tolist()],
        "bias": round(module.layer.bias.item(), 6),
        "log_dir": os.path.relpath(logger.log_dir, ROOT),
    }
    os.write(1, ("RESULT " + json.dumps(result) + "\n").encode())


if __name__ == "__main__":
    main()
