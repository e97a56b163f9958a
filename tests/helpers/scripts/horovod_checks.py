"""Horovod checks, run by tests/tiers/horovod/test_horovod.py with the .venv-horovod interpreter.

    horovodrun -np 2 -H localhost:2 python tests/helpers/scripts/horovod_checks.py all|collectives|training|fail TOKEN
    python tests/helpers/scripts/horovod_checks.py single TOKEN          # no horovodrun: one process (all the checks)

Every rank prints ``RESULT {json}`` with its observations; the test compares them. ``TOKEN`` only marks the
processes, so that the test can find any that outlive the job.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from fabric_lite import Fabric

GLOBAL_BATCH = 8
STEPS = 2  # plain steps, then STEPS steps of two accumulated micro-batches


def emit(result: dict) -> None:
    os.write(1, ("RESULT " + json.dumps(result) + "\n").encode())


def collectives(fabric: Fabric) -> dict:
    rank = fabric.global_rank
    out: dict = {}
    x = torch.tensor([float(rank + 1), 10.0 * (rank + 1)])
    same = fabric.all_reduce(x)
    out["mean"] = same.tolist()
    out["mean_in_place"] = same is x
    out["int_mean"] = fabric.all_reduce(torch.tensor([3 * rank + 1]), reduce_op="mean").tolist()  # (1+4)/2 -> 2
    out["int_mean_dtype"] = str(fabric.all_reduce(torch.tensor([3 * rank + 1], dtype=torch.int32)).dtype)
    out["sum"] = fabric.all_reduce(torch.tensor([rank + 1.0]), reduce_op="sum").tolist()
    out["none_is_sum"] = fabric.all_reduce(torch.tensor([rank + 1.0]), reduce_op=None).tolist()
    out["max"] = fabric.all_reduce(torch.tensor([rank + 1, -rank]), reduce_op="max").tolist()
    out["min"] = fabric.all_reduce(torch.tensor([rank + 1, -rank]), reduce_op="min").tolist()
    out["product"] = fabric.all_reduce(torch.tensor([rank + 2.0]), reduce_op="product").tolist()
    flags = torch.tensor([rank == 0, True, False])
    out["bool_any"] = fabric.all_reduce(flags.clone(), reduce_op="sum").tolist()
    out["bool_all"] = fabric.all_reduce(flags.clone(), reduce_op="product").tolist()
    reduced = fabric.all_reduce({"loss": torch.tensor(rank + 1.0), "n": rank + 3, "name": "x"}, reduce_op="sum")
    out["collection"] = [reduced["loss"].item(), reduced["n"].item(), str(reduced["n"].dtype), reduced["name"]]
    gathered = fabric.all_gather(torch.arange(3) + 10 * rank)
    out["gather"] = [list(gathered.shape), gathered.tolist()]
    pair = fabric.all_gather({"a": torch.tensor(rank), "b": [torch.ones(2) * rank]})
    out["gather_collection"] = [pair["a"].tolist(), pair["b"][0].tolist()]
    # sync_grads: rank q's loss weights slice i by (q + 1) * (i + 1), so rank r's input gets (r + 1) * sum_q (q + 1)
    leaf = torch.tensor([rank + 1.0], requires_grad=True)
    stacked = fabric.all_gather(leaf, sync_grads=True)
    weights = torch.tensor([[float((rank + 1) * (i + 1))] for i in range(fabric.world_size)])
    (stacked * weights).sum().backward()
    out["sync_grads"] = leaf.grad.tolist()
    # rank 0 passes None: Horovod's default broadcast name (the type's name) would differ between the ranks
    last = fabric.world_size - 1
    out["broadcast_obj"] = fabric.broadcast({"from": rank} if rank == last else None, src=last)
    sent = fabric.broadcast(torch.arange(4) * (rank + 1), src=0)
    out["broadcast_tensor"] = [sent.tolist(), str(sent.device)]
    fabric.barrier("here")
    out["all_true"] = fabric.strategy.reduce_boolean_decision(rank == 0, all=True)
    out["any_true"] = fabric.strategy.reduce_boolean_decision(rank == 0, all=False)
    out["reduce_alias"] = fabric.strategy.reduce(torch.tensor([rank * 2.0])).tolist()
    try:
        fabric.all_reduce(torch.ones(1), group=object())
    except ValueError as err:
        out["group_error"] = str(err)
    return out


def _data() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    n = GLOBAL_BATCH * 2 * STEPS
    return torch.randn(n, 4, generator=g), torch.randn(n, 2, generator=g)


def _model(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2))


def _optimizer(model: nn.Module) -> torch.optim.Optimizer:
    # weight decay and Adam's step count: what hvd.broadcast_optimizer_state's zero-gradient step would disturb
    return torch.optim.AdamW(model.parameters(), lr=0.05, weight_decay=0.1)


def _pre_step(model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """What rank 0 (only) does before setup: one step, so that its optimizer has state and its weights moved."""
    x = torch.ones(3, 4)
    nn.functional.mse_loss(model(x), torch.zeros(3, 2)).backward()
    optimizer.step()
    optimizer.zero_grad()


def _same_everywhere(fabric: Fabric, t: torch.Tensor) -> bool:
    if fabric.world_size == 1:
        return True
    return bool(torch.equal(*fabric.all_gather(t).unbind()))


def _flat(model: nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def _reference() -> tuple[torch.Tensor, torch.Tensor]:
    """One process over the global batch, from rank 0's starting point: the weights and the step count."""
    model = _model(0)
    optimizer = _optimizer(model)
    _pre_step(model, optimizer)
    x, y = _data()
    for step in range(2 * STEPS):
        lo = step * GLOBAL_BATCH
        loss = nn.functional.mse_loss(model(x[lo : lo + GLOBAL_BATCH]), y[lo : lo + GLOBAL_BATCH])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    step_count = next(iter(optimizer.state.values()))["step"]
    return _flat(model), torch.as_tensor(step_count)


def training(fabric: Fabric) -> dict:
    rank, world = fabric.global_rank, fabric.world_size
    out: dict = {}
    model = _model(rank)  # different on every rank: setup must broadcast rank 0's
    optimizer = _optimizer(model)
    if rank == 0:
        _pre_step(model, optimizer)  # only rank 0 has optimizer state: setup must send it to the others
    # a second pair where every rank has (different) state: the hvd.broadcast_optimizer_state path
    other = _model(100 + rank)
    other_opt = torch.optim.Adam(other.parameters(), lr=0.1 * (rank + 1))
    _pre_step(other, other_opt)
    model, optimizer = fabric.setup(model, optimizer)
    other, other_opt = fabric.setup(other, other_opt)
    out["optimizer_type"] = type(optimizer.optimizer).__module__
    out["other_state"] = [
        other_opt.param_groups[0]["lr"],
        float(next(iter(other_opt.state.values()))["exp_avg"].sum()),
        float(_flat(other).sum()),
    ]
    out["start_same"] = _same_everywhere(fabric, _flat(model))
    local = GLOBAL_BATCH // world
    x, y = _data()
    for step in range(STEPS):  # plain steps: each rank takes its slice of the global batch
        lo = step * GLOBAL_BATCH + rank * local
        loss = nn.functional.mse_loss(model(x[lo : lo + local]), y[lo : lo + local])
        optimizer.zero_grad()
        fabric.backward(loss)
        optimizer.step()
    half = local // 2
    for step in range(STEPS, 2 * STEPS):  # two micro-batches per rank, the first without gradient sync
        lo = step * GLOBAL_BATCH + rank * local
        optimizer.zero_grad(set_to_none=False)  # torch's argument works on Horovod's optimizer too
        with fabric.no_backward_sync(model):
            loss = nn.functional.mse_loss(model(x[lo : lo + half]), y[lo : lo + half]) / 2
            fabric.backward(loss)
        local_grad = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
        out["local_grads_differ"] = not _same_everywhere(fabric, local_grad)
        loss = nn.functional.mse_loss(model(x[lo + half : lo + local]), y[lo + half : lo + local]) / 2
        fabric.backward(loss)
        optimizer.step()
    out["end_same"] = _same_everywhere(fabric, _flat(model))
    expected, steps = _reference()
    out["max_diff_to_reference"] = float((_flat(model) - expected).abs().max())
    out["step_count"] = [float(next(iter(optimizer.state.values()))["step"]), float(steps)]
    # a checkpoint: rank 0 writes, every rank returns once it is complete
    path = os.path.join(tempfile.gettempdir(), f"hvd_ckpt_{os.environ.get('HOROVOD_GLOO_RENDEZVOUS_PORT', 'x')}.pt")
    fabric.save(path, {"model": model, "optimizer": optimizer, "step": 4})
    out["checkpoint_visible"] = os.path.isfile(path)
    restored = _model(999)
    fabric.load(path, {"model": restored}, strict=False)
    out["checkpoint_equal"] = bool(torch.equal(_flat(restored), _flat(model)))
    fabric.barrier()
    if rank == 0:
        os.remove(path)
    loader = fabric.setup_dataloaders(DataLoader(TensorDataset(torch.arange(10)), batch_size=1))
    out["loader"] = [int(b[0]) for b in loader]
    return out


def main() -> None:
    mode = sys.argv[1]
    fabric = Fabric(accelerator="cpu", strategy="horovod")
    before = [fabric.global_rank, fabric.world_size, fabric.local_rank]
    fabric.launch()
    result = {
        "rank": fabric.global_rank,
        "before_launch": before,
        "after_launch": [fabric.global_rank, fabric.world_size, fabric.local_rank],
        "strategy": type(fabric.strategy).__name__,
        "device": str(fabric.device),
        "sampler": fabric.strategy.distributed_sampler_kwargs,
    }
    if mode == "collectives":
        result.update(collectives(fabric))
    elif mode == "training":
        result.update(training(fabric))
    elif mode in ("all", "single"):
        result.update(collectives(fabric) | training(fabric))
        if mode == "single":  # an instance instead of the name, in the same process
            from fabric_lite.strategies import HorovodStrategy

            other = Fabric(accelerator="cpu", strategy=HorovodStrategy())
            other.launch()
            result["instance"] = [type(other.strategy).__name__, str(other.device), other.world_size]
    elif mode == "fail":
        if fabric.global_rank == 1:
            raise RuntimeError("rank 1 fails on purpose")
        fabric.barrier()  # rank 0 waits for a rank that is gone: horovodrun must end the job
    fabric.strategy.teardown()
    emit(result)


if __name__ == "__main__":
    main()
