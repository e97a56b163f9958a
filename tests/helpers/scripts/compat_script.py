"""One script, two implementations: run with COMPAT_IMPL=lightning or COMPAT_IMPL=fabric_lite.

Prints ``OBS {json}`` lines (one per rank, written with one write() each) describing the results of collectives,
a short training run and the process properties, in a form that can be compared exactly. Only behaviour where
fabric_lite promises to be identical to Lightning Fabric is observed here (see tests/compat/test_compat.py).

    COMPAT_IMPL=fabric_lite python tests/helpers/scripts/compat_script.py --strategy ddp --devices 2
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import os

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

if os.environ.get("COMPAT_IMPL") == "lightning":
    from lightning_fabric import Fabric, seed_everything
else:
    from fabric_lite import Fabric, seed_everything

Pair = collections.namedtuple("Pair", "a b")


@dataclasses.dataclass
class Box:
    x: torch.Tensor
    y: float


def describe(value):
    if isinstance(value, torch.Tensor):
        return {"T": str(value.dtype), "shape": list(value.shape), "v": value.tolist(), "rg": value.requires_grad}
    if isinstance(value, dict):
        return {"dict": type(value).__name__, "items": {str(k): describe(v) for k, v in value.items()}}
    if dataclasses.is_dataclass(value):
        return {
            "dc": type(value).__name__,
            "fields": [describe(getattr(value, f.name)) for f in dataclasses.fields(value)],
        }
    if isinstance(value, (list, tuple)):
        return {"seq": type(value).__name__, "items": [describe(v) for v in value]}
    return {"py": type(value).__name__, "v": repr(value)}


def collectives(fabric) -> dict:
    rank = fabric.global_rank
    obs = {}
    for op in ["mean", "sum", "max", "min", "avg", "product"]:
        for dtype in [torch.float32, torch.float64, torch.int32, torch.int64]:
            t = torch.tensor([rank + 1, 2 * rank + 3], dtype=dtype)
            out = fabric.all_reduce(t, reduce_op=op)
            obs[f"all_reduce/{op}/{dtype}"] = [describe(out), out is t, t.tolist()]
    obs["all_reduce/ReduceOp.SUM"] = describe(
        fabric.all_reduce(torch.tensor(rank + 1.0), reduce_op=torch.distributed.ReduceOp.SUM)
    )
    obs["all_reduce/int"] = describe(fabric.all_reduce(rank + 1))
    obs["all_reduce/float"] = describe(fabric.all_reduce(rank + 1.5))
    obs["all_reduce/bool"] = describe(fabric.all_reduce(True, reduce_op="sum"))
    obs["all_reduce/non_tensors"] = [describe(fabric.all_reduce("text")), describe(fabric.all_reduce(None))]
    obs["all_reduce/dict"] = describe(
        fabric.all_reduce(
            {"a": torch.tensor(float(rank)), "b": [rank, torch.ones(2) * rank], "c": "s"}, reduce_op="sum"
        )
    )
    obs["all_reduce/namedtuple"] = describe(fabric.all_reduce(Pair(torch.tensor(rank * 2.0), 3), reduce_op="sum"))
    obs["all_reduce/dataclass"] = describe(fabric.all_reduce(Box(torch.tensor(rank * 2.0), 1.0), reduce_op="sum"))
    x = torch.tensor([1.0, 2.0], requires_grad=True)
    y = x * (rank + 1)
    out = fabric.all_reduce(y, reduce_op="sum")
    out.sum().backward()
    obs["all_reduce/graph"] = [describe(out), describe(x.grad)]
    obs["all_gather/tensor"] = describe(fabric.all_gather(torch.arange(3) + 3 * rank))
    obs["all_gather/scalar"] = describe(fabric.all_gather(torch.tensor(rank * 1.0)))
    obs["all_gather/int"] = describe(fabric.all_gather(rank))
    obs["all_gather/float"] = describe(fabric.all_gather(rank + 0.5))
    obs["all_gather/dict"] = describe(fabric.all_gather({"a": torch.tensor([rank]), "b": (rank, "x")}))
    xg = torch.tensor([1.0, 2.0], requires_grad=True)
    gathered = fabric.all_gather(xg * (rank + 1), sync_grads=True)
    gathered.sum().backward()
    obs["all_gather/sync_grads"] = [describe(gathered), describe(xg.grad)]
    obs["all_gather/no_sync_grads"] = describe(fabric.all_gather(xg * 1.0))
    last = fabric.world_size - 1
    obs["broadcast/tensor"] = describe(fabric.broadcast(torch.tensor([rank, rank]), src=last))
    obs["broadcast/object"] = describe(fabric.broadcast({"r": rank, "l": [rank]}, src=0))
    obs["broadcast/int"] = describe(fabric.broadcast(rank, src=last))
    obs["broadcast/other_shape"] = describe(fabric.broadcast(torch.zeros(rank + 1), src=last))
    obs["reduce_boolean_decision"] = [
        fabric.strategy.reduce_boolean_decision(rank == 0),
        fabric.strategy.reduce_boolean_decision(rank == 0, all=False),
        fabric.strategy.reduce_boolean_decision(True),
    ]
    obs["barrier"] = [describe(fabric.barrier()), describe(fabric.barrier("named"))]
    return obs


def training(fabric) -> dict:
    true_half = fabric.strategy.precision.precision in ("16-true", "bf16-true")
    seed_everything(7)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
    if true_half:
        # Adam's eps=1e-8 is 0 in float16: true half precision wants a plain optimizer
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    else:
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    model, optimizer = fabric.setup(model, optimizer)
    g = torch.Generator().manual_seed(3)
    data = TensorDataset(torch.randn(64, 8, generator=g), torch.randint(0, 2, (64,), generator=g))
    loader = fabric.setup_dataloaders(DataLoader(data, batch_size=8, shuffle=True))
    losses = []
    for _epoch in range(2):
        for x, y in loader:
            loss = nn.functional.cross_entropy(model(x), y)
            optimizer.zero_grad()
            fabric.backward(loss)
            if true_half:  # a float16 gradient norm overflows easily (in Lightning too): clip by value
                fabric.clip_gradients(model, optimizer, clip_val=1.0)
            else:
                fabric.clip_gradients(model, optimizer, max_norm=1.0)
            optimizer.step()
            losses.append(loss.item())
    state = model.state_dict()
    probe = model(torch.randn(2, 8, generator=g))
    return {
        "dtypes": [str(next(model.parameters()).dtype), str(probe.dtype), str(next(model.parameters()).grad.dtype)],
        "losses": losses,
        "state_keys": list(state),
        "params": [round(v, 7) for p in state.values() for v in p.flatten().tolist()][:40],
        "optimizer_keys": sorted(optimizer.state_dict()),
        "types": [type(model).__name__, isinstance(optimizer, torch.optim.Optimizer), len(loader)],
    }


def run(fabric) -> dict:
    obs = {
        "props": [
            fabric.global_rank,
            fabric.local_rank,
            fabric.node_rank,
            fabric.world_size,
            fabric.is_global_zero,
            str(fabric.device),
        ],
        "collectives": {} if os.environ.get("COMPAT_ONLY_TRAINING") == "1" else collectives(fabric),
        "training": training(fabric),
    }
    row = {"rank": fabric.global_rank, "precision": os.environ.get("COMPAT_PRECISION"), "obs": obs}
    os.write(1, ("OBS " + json.dumps(row) + "\n").encode())
    return {"rank0": fabric.global_rank}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--strategy", default="auto")
    parser.add_argument("--devices", default="1")
    parser.add_argument("--precision", default="32-true", help="one precision, or several (comma-separated) in turn")
    parser.add_argument("--only-training", action="store_true")
    args = parser.parse_args()
    devices = int(args.devices) if args.devices.isdigit() else args.devices
    precisions = args.precision.split(",")
    if len(precisions) > 1:  # one process, one Fabric per precision (single device only): each OBS line says which
        for precision in precisions:
            os.environ["COMPAT_ONLY_TRAINING"] = "1" if args.only_training else "0"
            fabric = Fabric(accelerator="cpu", devices=devices, strategy=args.strategy, precision=precision)
            fabric.launch()
            os.environ["COMPAT_PRECISION"] = precision
            run(fabric)
        return
    fabric = Fabric(accelerator="cpu", devices=devices, strategy=args.strategy, precision=args.precision)
    # spawned workers re-import this module, so the choice travels in the environment
    os.environ["COMPAT_ONLY_TRAINING"] = "1" if args.only_training else "0"
    if args.strategy == "ddp_spawn":
        result = fabric.launch(run)
        os.write(1, ("LAUNCHED " + json.dumps(result) + "\n").encode())
    else:
        fabric.launch()
        run(fabric)


if __name__ == "__main__":
    main()
