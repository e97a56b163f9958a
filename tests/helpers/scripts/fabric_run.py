"""`Fabric.run` overridden in subclasses (tests/distributed/test_fabric_run.py): `TrainFabric(...).run(steps,
scale=...)` starts the strategy's processes and runs the body in each, as Lightning Fabric's subclass-and-override entry
point does.

    python tests/helpers/scripts/fabric_run.py STRATEGY CLASS   # e.g. ddp_spawn TrainFabric

Every process that runs the body prints `RESULT {json}`; the launching process prints `RETURNED {json}` with what
`run(...)` returned to it.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from fabric_lite import Fabric


def emit(tag: str, value: Any) -> None:
    os.write(1, f"{tag} {json.dumps(value)}\n".encode())  # one write per line: ranks never interleave


class TrainFabric(Fabric):
    def run(self, steps: int, *, scale: float = 1.0) -> dict[str, Any]:
        model = nn.Linear(2, 1, bias=False)
        nn.init.constant_(model.weight, 1.0)
        model, optimizer = self.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
        for _ in range(steps):
            x = torch.full((1, 2), float(self.global_rank + 1))  # rank-dependent: the gradients are averaged
            optimizer.zero_grad()
            self.backward(model(x).sum())
            optimizer.step()
        result = {
            "rank": self.global_rank,
            "world": self.world_size,
            "initialized": dist.is_initialized(),
            "total": scale * self.all_reduce(torch.tensor(float(self.global_rank + 1)), reduce_op="sum").item(),
            "weight": model.module.weight.detach().flatten().tolist(),
        }
        emit("RESULT", result)
        return result


class Inherited(TrainFabric):
    """Does not override run: the parent's runs."""


class CallsSuper(TrainFabric):
    def run(self, steps: int, *, scale: float = 1.0) -> dict[str, Any]:
        # inside the processes already: the parent's run is a plain call, it starts nothing
        return {"outer_rank": self.global_rank, **super().run(steps, scale=scale)}


if __name__ == "__main__":
    strategy, name = sys.argv[1], sys.argv[2]
    fabric = {"TrainFabric": TrainFabric, "Inherited": Inherited, "CallsSuper": CallsSuper}[name](
        accelerator="cpu", devices=2, strategy=strategy
    )
    emit("RETURNED", {"pid": os.getpid(), "value": fabric.run(3, scale=2.0)})
