"""Multi-process checks of the CheckpointIO plugin and of FSDPPrecision, for
tests/distributed/test_collective_plugins.py.

    python -m tests.helpers.scripts.checkpoint_io_plugins io plugins,strategy NPROCS OUT_DIR
    python -m tests.helpers.scripts.checkpoint_io_plugins fsdp_precision plugin,flag NPROCS OUT_DIR

Fabric's script launcher re-runs this module once per extra rank. Each of the comma-separated ways runs in turn, with
a Fabric of its own in the same processes; every rank writes ``OUT_DIR/<way>/rank<N>.json``.

* ``io``: a :class:`JsonCheckpointIO` (its own format: JSON, tensors as lists) given through ``plugins=`` or
  ``DDPStrategy(checkpoint_io=...)``; ``fabric.save`` then ``fabric.load``; each rank records the calls its
  plugin received.
* ``fsdp_precision``: three bf16-mixed FSDP steps with ``plugins=[FSDPPrecision("bf16-mixed")]`` or with
  ``precision="bf16-mixed"``; each rank records the losses, the final full state and the policy in use.
"""

from __future__ import annotations

import json
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
from torch import nn

from fabric_lite import Fabric
from fabric_lite.plugins import CheckpointIO, FSDPPrecision
from fabric_lite.strategies import DDPStrategy, FSDPStrategy


def _encode(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return {"__tensor__": value.tolist(), "dtype": str(value.dtype).replace("torch.", "")}
    if isinstance(value, dict):
        return {str(k): _encode(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_encode(v) for v in value]
    return value


def _decode(value: Any) -> Any:
    if isinstance(value, dict) and "__tensor__" in value:
        return torch.tensor(value["__tensor__"], dtype=getattr(torch, value["dtype"]))
    if isinstance(value, dict):
        return {k: _decode(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_decode(v) for v in value]
    return value


class JsonCheckpointIO(CheckpointIO):
    """Writes checkpoints as JSON (tensors as lists) and records every call it receives."""

    def __init__(self) -> None:
        self.calls: list[list[Any]] = []

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any | None = None) -> None:
        self.calls.append(["save", Path(path).name, sorted(checkpoint), storage_options])
        Path(path).write_text(json.dumps(_encode(checkpoint)))

    def load_checkpoint(self, path: Any, map_location: Any | None = None, weights_only: bool | None = None) -> Any:
        self.calls.append(["load", Path(path).name, weights_only])
        return _decode(json.loads(Path(path).read_text()))

    def remove_checkpoint(self, path: Any) -> None:
        self.calls.append(["remove", Path(path).name])
        Path(path).unlink()

    def teardown(self) -> None:
        self.calls.append(["teardown"])


def io(how: str, nprocs: int, out: Path) -> dict[str, Any]:
    plugin = JsonCheckpointIO()
    if how == "plugins":
        fabric = Fabric(accelerator="cpu", devices=nprocs, strategy="ddp", plugins=[plugin])
    else:
        strategy = DDPStrategy(checkpoint_io=plugin, timeout=timedelta(seconds=60))
        fabric = Fabric(accelerator="cpu", devices=nprocs, strategy=strategy)
    fabric.launch()
    torch.manual_seed(0)
    model = fabric.setup(nn.Linear(3, 2))
    path = out / "state.json"
    fabric.save(path, {"model": model, "step": 7 + 0 * fabric.global_rank, "tag": "json"})
    restored = fabric.setup(nn.Linear(3, 2))
    with torch.no_grad():
        for p in restored.parameters():
            p.zero_()
    remainder = fabric.load(path, {"model": restored})
    same = all(torch.equal(a, b) for a, b in zip(model.parameters(), restored.parameters()))
    return {
        "rank": fabric.global_rank,
        "calls": plugin.calls,
        "remainder": remainder,
        "restored_equal": same,
        "is_strategy_io": fabric.strategy.checkpoint_io is plugin,
    }


def fsdp_precision(how: str, nprocs: int, out: Path) -> dict[str, Any]:
    from tests.helpers.jobs.fsdp_jobs import Net, full_model_state, rank_batch

    strategy = FSDPStrategy(timeout=timedelta(seconds=60))
    if how == "plugin":
        fabric = Fabric(accelerator="cpu", devices=nprocs, strategy=strategy, plugins=[FSDPPrecision("bf16-mixed")])
    else:
        fabric = Fabric(accelerator="cpu", devices=nprocs, strategy=strategy, precision="bf16-mixed")
    fabric.launch()
    torch.manual_seed(0)
    model = Net()
    seen: list[list[str]] = []
    model.blocks[0].fc1.register_forward_hook(lambda m, i, o: seen.append([str(m.weight.dtype), str(o.dtype)]))
    fmodel = fabric.setup_module(model)
    optimizer = fabric.setup_optimizers(torch.optim.SGD(fmodel.parameters(), lr=0.1))
    losses = []
    for step in range(3):
        x, y = rank_batch(fabric, step)
        loss = nn.functional.mse_loss(fmodel(x), y)
        optimizer.zero_grad()
        fabric.backward(loss)
        optimizer.step()
        losses.append(loss.item())
    policy = fabric.strategy.mixed_precision
    param = next(iter(fmodel.parameters()))
    return {
        "rank": fabric.global_rank,
        "precision": [type(fabric.strategy.precision).__name__, fabric.strategy.precision.precision],
        "policy": [str(policy.param_dtype), str(policy.reduce_dtype)],
        "compute_dtypes": sorted({tuple(s) for s in seen}),
        "shard_dtype": str(param.dtype),
        "losses": losses,
        "state": {k: v.tolist() for k, v in full_model_state(fmodel).items()},
    }


def main() -> None:
    mode, hows, nprocs, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), Path(sys.argv[4])
    for how in hows.split(","):  # one after another: a later Fabric joins the processes the first one started
        (out / how).mkdir(exist_ok=True)
        result = {"io": io, "fsdp_precision": fsdp_precision}[mode](how, nprocs, out / how)
        (out / how / f"rank{result['rank']}.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main()
