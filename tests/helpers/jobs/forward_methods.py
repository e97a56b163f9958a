"""Methods other than ``forward`` called on a DDP-wrapped module (tests/distributed/test_wrappers.py)."""

from __future__ import annotations

import torch
from torch import nn


class Agent(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Linear(3, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)

    def act(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x).argmax(dim=-1)

    def describe(self) -> str:
        return "an agent"


def unmarked_methods(fabric) -> dict:  # type: ignore[no-untyped-def]
    torch.manual_seed(0)
    model = fabric.setup(Agent())
    x = torch.full((2, 3), float(fabric.global_rank + 1))
    seen: dict = {"describe": model.describe()}  # no submodule runs: fine
    with torch.no_grad():
        seen["act_no_grad"] = model.act(x).tolist()  # submodules run, no gradients: fine
    try:
        model.act(x)
        seen["act_with_grad"] = "no error"
    except RuntimeError as err:
        seen["act_with_grad"] = str(err)
    seen["hooks_left"] = sum(len(m._forward_pre_hooks) for m in model.module.modules())
    model.mark_forward_method("act")
    out = model.act(x)  # through DDP's forward now
    seen["marked"] = out.tolist()
    loss = model(x).sum()
    fabric.backward(loss)
    seen["grad"] = model.module.body.weight.grad.sum().item()  # averaged over ranks: the same on both
    return seen
