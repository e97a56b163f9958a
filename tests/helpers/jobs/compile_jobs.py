"""``torch.compile`` under the DDP strategy, on real gloo ranks (tests/distributed/test_compile.py, through
``spawn_job``)."""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from tests.helpers.jobs.checks import record

STEPS = 4


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(6, 16)
        self.fc2 = nn.Linear(16, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.tanh(self.fc1(x)))

    def score(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward(x).sum(dim=-1)


class CountingBackend:
    """A ``torch.compile`` backend that runs the graph eagerly and counts the graphs it was given."""

    def __init__(self) -> None:
        self.graphs = 0

    def __call__(self, graph: torch.fx.GraphModule, example_inputs: Any) -> Callable[..., Any]:
        self.graphs += 1
        return graph.forward


def batch(rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank-dependent data: the ranks' gradients differ, so an unsynchronised step would show."""
    g = torch.Generator().manual_seed(100 * rank + step)
    return torch.randn(4, 6, generator=g), torch.randn(4, 3, generator=g)


def train(fabric: Any, model: Any, optimizer: Any) -> list[float]:
    losses = []
    for step in range(STEPS):
        x, y = batch(fabric.global_rank, step)
        loss = nn.functional.mse_loss(model(x), y)
        fabric.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses


def ddp_compile(fabric: Any, backend: str | None, folder: str) -> dict[str, Any]:
    """Compiled DDP training against eager DDP, then what else a compiled DDP model must do."""
    torch.manual_seed(0)
    template = Net()

    def setup(compiled: bool, **compile_kwargs: Any) -> tuple[Any, Any]:
        net = copy.deepcopy(template)
        module = torch.compile(net, **compile_kwargs) if compiled else net
        return fabric.setup(module, torch.optim.SGD(net.parameters(), lr=0.1))

    def losses() -> dict[str, Any]:
        eager = train(fabric, *setup(compiled=False))
        model, optimizer = setup(compiled=True, **({} if backend is None else {"backend": backend}))
        compiled = train(fabric, model, optimizer)
        return {
            "eager": eager,
            "compiled": compiled,
            # fabric.setup compiled the DDP module, not the module inside DDP
            "call": type(model._call).__name__,
            "call_wraps_ddp": isinstance(model._call._orig_mod, DistributedDataParallel),
            "strategy_module": type(model._strategy_module).__name__,
            "inner": type(model._strategy_module.module).__name__,
            "weights": model.module.fc1.weight.sum().item(),  # equal on both ranks only if gradients were averaged
        }

    def options_survive() -> dict[str, Any]:
        counter = CountingBackend()
        model, optimizer = setup(compiled=True, backend=counter, fullgraph=False)
        train(fabric, model, optimizer)
        return {"graphs": counter.graphs, "wraps_ddp": isinstance(model._call._orig_mod, DistributedDataParallel)}

    def no_backward_sync() -> dict[str, Any]:
        model, optimizer = setup(compiled=True, backend="eager")
        x, y = batch(fabric.global_rank, 0)
        with fabric.no_backward_sync(model):
            fabric.backward(nn.functional.mse_loss(model(x), y))
        local = model.module.fc2.bias.grad.clone()  # this rank's own gradient: not averaged
        fabric.backward(nn.functional.mse_loss(model(x), y))  # synchronises both accumulated gradients
        return {"local": local.tolist(), "synced": model.module.fc2.bias.grad.tolist()}

    def marked_method() -> dict[str, Any]:
        counter = CountingBackend()
        model, optimizer = setup(compiled=True, backend=counter)
        model.mark_forward_method("score")
        x, _ = batch(fabric.global_rank, 0)
        before = counter.graphs
        out = model.score(x)
        fabric.backward(out.sum())  # through DDP's forward: DDP expects this backward and averages it
        return {
            "score": out.tolist(),
            "eager_score": model.module.score(x).tolist(),
            "compiled_graphs": counter.graphs - before,
            "grad": model.module.fc1.weight.grad.sum().item(),
        }

    def checkpoint_keys() -> dict[str, Any]:
        keys = {}
        for reapply in (True, False):
            net = copy.deepcopy(template)
            model = fabric.setup(torch.compile(net, backend="eager"), _reapply_compile=reapply)
            path = Path(folder) / f"reapply_{reapply}.ckpt"
            fabric.save(path, {"model": model})
            fabric.barrier()
            keys[str(reapply)] = sorted(torch.load(path, weights_only=True)["model"])
            eager = fabric.setup(Net())
            fabric.load(path, {"model": eager})  # a checkpoint of a compiled model loads into an eager one
            keys[f"{reapply}_loaded"] = torch.equal(eager.module.fc1.weight, net.fc1.weight)
            fabric.barrier()
        return keys

    return record(
        {
            "losses": losses,
            "options_survive": options_survive,
            "no_backward_sync": no_backward_sync,
            "marked_method": marked_method,
            "checkpoint_keys": checkpoint_keys,
        }
    )


# ---------------------------------------------------------------------------------------------- FSDP
class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(width, 2 * width)
        self.fc2 = nn.Linear(2 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(torch.tanh(self.fc1(x)))


class Deep(nn.Module):
    def __init__(self, width: int = 8) -> None:
        super().__init__()
        self.inp = nn.Linear(6, width)
        self.blocks = nn.Sequential(Block(width), Block(width))
        self.out = nn.Linear(width, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.blocks(self.inp(x)))


def fsdp_compile(fabric: Any) -> dict[str, Any]:
    """Compiled FSDP training (block by block, ``aot_eager``: forward and backward graphs) against eager FSDP."""
    torch.manual_seed(0)
    template = Deep()

    def run(compiled: bool) -> tuple[list[float], Any]:
        net = copy.deepcopy(template)
        model = fabric.setup_module(torch.compile(net, backend="aot_eager") if compiled else net)
        optimizer = fabric.setup_optimizers(torch.optim.SGD(model.parameters(), lr=0.1))
        return train(fabric, model, optimizer), model

    def losses() -> dict[str, Any]:
        eager, _ = run(compiled=False)
        compiled, model = run(compiled=True)
        return {
            "eager": eager,
            "compiled": compiled,
            "compiled_modules": sorted(
                name for name, m in model.module.named_modules() if m._compiled_call_impl is not None
            ),
            "call_is_root": model._call is model._forward_module is model.module,
            "keys": sorted(model.state_dict()),
        }

    return record({"losses": losses})


def main() -> None:
    """``python -m tests.helpers.jobs.compile_jobs NPROCS OUT_PATH``: :func:`fsdp_compile` on NPROCS ranks (the FSDP
    strategy launches the other ranks by running this module again); rank 0 pickles every rank's result."""
    import sys
    from datetime import timedelta

    from fabric_lite import Fabric
    from fabric_lite.strategies import FSDPStrategy
    from tests.helpers.jobs._runner import dump_all_ranks

    nprocs, out = int(sys.argv[1]), sys.argv[2]
    strategy = FSDPStrategy(auto_wrap_policy={Block}, timeout=timedelta(seconds=120))
    fabric = Fabric(accelerator="cpu", devices=nprocs, strategy=strategy)
    fabric.launch()
    result = fsdp_compile(fabric)
    dump_all_ranks(fabric, result, out)


if __name__ == "__main__":
    main()
