"""Jobs for the reliability tier (RELIABILITY.md cases 25 and 26): uneven batches and the soak."""

from __future__ import annotations

import os
import time
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, Sampler, TensorDataset

from tests.helpers.jobs.collectives import catch


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def uneven_batches(fabric: Any) -> dict[str, Any]:
    """Case 25: 5 samples on 2 ranks through a DistributedSampler give both ranks the same number of batches and
    the epoch ends without a hang; loaders whose own sampler gives the ranks different numbers of batches are
    refused at setup on every rank."""
    rank, world = fabric.global_rank, fabric.world_size
    out: dict[str, Any] = {}
    module = nn.Linear(3, 1)
    model, optimizer = fabric.setup(module, torch.optim.SGD(module.parameters(), lr=0.1))
    data = TensorDataset(torch.randn(5, 3, generator=torch.Generator().manual_seed(0)), torch.zeros(5, 1))
    loader = fabric.setup_dataloaders(DataLoader(data, batch_size=2))
    batches = 0
    for x, y in loader:
        optimizer.zero_grad()
        fabric.backward(nn.functional.mse_loss(model(x), y))
        optimizer.step()
        batches += 1
    fabric.barrier()  # every rank reaches the end of the epoch
    out["distributed_sampler_batches"] = batches

    class OwnShard(Sampler[int]):
        """A user's sampler that splits unevenly: rank r gets r + 2 samples."""

        def __init__(self, n: int) -> None:
            self.n = n

        def __iter__(self) -> Any:
            return iter(range(self.n))

        def __len__(self) -> int:
            return self.n

    uneven = DataLoader(data, batch_size=1, sampler=OwnShard(rank + 2))
    out["own_sampler_uneven"] = catch(lambda: fabric.setup_dataloaders(uneven, use_distributed_sampler=False))
    even = DataLoader(data, batch_size=1, sampler=OwnShard(3))
    out["own_sampler_even"] = catch(lambda: len(fabric.setup_dataloaders(even, use_distributed_sampler=False)))
    out["world"] = world
    return out


def soak(fabric: Any, all_reduce: int, all_gather: int, broadcast: int, barrier: int) -> dict[str, Any]:
    """Case 26: thousands of collectives of each kind, every value checked, memory sampled along the way."""
    rank, world = fabric.global_rank, fabric.world_size
    wrong: dict[str, int] = {"all_reduce": 0, "all_gather": 0, "broadcast": 0}
    rss: list[float] = []
    started = time.perf_counter()
    total = all_reduce + all_gather + broadcast + barrier
    sample_every = max(1, total // 40)
    done = 0

    def tick() -> None:
        nonlocal done
        done += 1
        if done % sample_every == 0:
            rss.append(_rss_mb())

    for i in range(all_reduce):
        # a collection with two dtypes, rank- and step-dependent, reduced with a rotating op
        op = ("sum", "max", "min", "mean")[i % 4]
        data = {"f": torch.tensor([float(rank + i), float(-rank)]), "i": torch.tensor(rank * 10 + i % 7)}
        got = fabric.all_reduce(data, reduce_op=op)
        ranks = range(world)
        expected_f = {
            "sum": [sum(r + i for r in ranks), -sum(ranks)],
            "max": [world - 1 + i, 0],
            "min": [i, -(world - 1)],
            "mean": [sum(r + i for r in ranks) / world, -sum(ranks) / world],
        }[op]
        ints = [r * 10 + i % 7 for r in ranks]
        expected_i = {"sum": sum(ints), "max": max(ints), "min": min(ints), "mean": int(sum(ints) / world)}[op]
        if got["f"].tolist() != expected_f or got["i"].item() != expected_i:
            wrong["all_reduce"] += 1
        tick()
    for i in range(all_gather):
        size = 1 + i % 300  # small payloads travel with the shape check, larger ones after it
        got = fabric.all_gather(torch.full((size,), rank + i, dtype=torch.int64))
        if got.shape != (world, size) or got[:, 0].tolist() != [r + i for r in range(world)]:
            wrong["all_gather"] += 1
        tick()
    for i in range(broadcast):
        src = i % world
        payload = torch.arange(i % 50, dtype=torch.float32) + src if i % 2 else {"step": i, "from": src}
        got = fabric.broadcast(payload if rank == src else None, src=src)
        expected = torch.arange(i % 50, dtype=torch.float32) + src if i % 2 else {"step": i, "from": src}
        same = torch.equal(got, expected) if isinstance(expected, torch.Tensor) else got == expected
        if not same:
            wrong["broadcast"] += 1
        tick()
    for _ in range(barrier):
        fabric.barrier()
        tick()
    return {"wrong": wrong, "rss": rss, "seconds": time.perf_counter() - started, "calls": done}
