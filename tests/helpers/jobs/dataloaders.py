"""``setup_dataloaders`` on two ranks (run by tests/distributed/test_dataloaders.py through
``tests.helpers.harness.spawn_job``).

:func:`observe` runs every check and returns, per check, plain observations (lists, numbers, strings) or the
traceback of the failure, so one broken check does not hide the others. The assertions live in the test file.
"""

from __future__ import annotations

import functools
import traceback
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.utils.data import (
    BatchSampler,
    DataLoader,
    DistributedSampler,
    IterableDataset,
    Sampler,
    SequentialSampler,
)

N = 20  # dataset size: even, so the two ranks' shards neither pad nor overlap


def collate(batch: list[int]) -> torch.Tensor:
    """A collate_fn of our own, to check that the re-created loader keeps it."""
    return torch.tensor(batch, dtype=torch.int64)


def _record_set_epoch(sampler: Any) -> list[int]:
    calls: list[int] = []
    original = sampler.set_epoch

    def set_epoch(epoch: int) -> None:
        calls.append(epoch)
        original(epoch)

    sampler.set_epoch = set_epoch
    return calls


def _epochs(loader: Any, epochs: int = 3) -> list[list[int]]:
    return [[int(i) for batch in loader for i in batch] for _ in range(epochs)]


def _sampler_facts(loader: Any) -> dict[str, Any]:
    sampler = loader.sampler
    facts = {"sampler": type(sampler).__name__}
    if isinstance(sampler, DistributedSampler):
        facts.update(shuffle=sampler.shuffle, seed=sampler.seed, num_replicas=sampler.num_replicas, rank=sampler.rank)
    return facts


def check_random(fabric: Any) -> dict[str, Any]:
    fabric.seed_everything(1234)
    loader = DataLoader(list(range(N)), batch_size=3, shuffle=True, drop_last=True, collate_fn=collate)
    floader = fabric.setup_dataloaders(loader)
    calls = _record_set_epoch(floader.sampler)
    epochs = _epochs(floader)
    calls_during_epochs = list(calls)
    shard_per_epoch = []
    for epoch in range(3):
        floader.sampler.set_epoch(epoch)
        shard_per_epoch.append(list(floader.sampler))
    return {
        **_sampler_facts(floader),
        "batch_size": floader.batch_size,
        "drop_last": floader.drop_last,
        "collate_is_ours": floader.collate_fn is collate,
        "loader_is_new": floader._dataloader is not loader,
        "original_sampler_kept": type(loader.sampler).__name__,
        "set_epoch_calls": calls_during_epochs,
        "epochs": epochs,
        "shards": shard_per_epoch,
        "batch_lengths": [len(batch) for batch in floader],
        "len": len(floader),
    }


def check_sequential(fabric: Any) -> dict[str, Any]:
    fabric.seed_everything(1234)
    floader = fabric.setup_dataloaders(DataLoader(list(range(N)), batch_size=4))
    return {**_sampler_facts(floader), "epochs": _epochs(floader, 2), "batch_size": floader.batch_size}


def check_generator(fabric: Any) -> dict[str, Any]:
    fabric.seed_everything(1234)
    generator = torch.Generator().manual_seed(99)
    floader = fabric.setup_dataloaders(DataLoader(list(range(N)), batch_size=5, shuffle=True, generator=generator))
    return {**_sampler_facts(floader), "generator_kept": floader.generator is generator, "epochs": _epochs(floader, 2)}


def check_workers(fabric: Any) -> dict[str, Any]:
    fabric.seed_everything(1234, workers=True)

    def user_init(worker_id: int) -> None:
        pass

    loader = DataLoader(list(range(N)), batch_size=2, num_workers=2, collate_fn=collate, persistent_workers=True)
    own = DataLoader(list(range(N)), batch_size=2, num_workers=1, worker_init_fn=user_init)
    floader, fown = fabric.setup_dataloaders(loader, own)
    init = floader.worker_init_fn
    return {
        "num_workers": floader.num_workers,
        "persistent_workers": floader.persistent_workers,
        "collate_is_ours": floader.collate_fn is collate,
        "worker_init": getattr(getattr(init, "func", None), "__name__", repr(init)),
        "worker_init_rank": init.keywords.get("rank") if isinstance(init, functools.partial) else None,
        "user_worker_init_kept": fown.worker_init_fn is user_init,
        "own_num_workers": fown.num_workers,
    }


class ReversedSampler(Sampler[int]):
    """A custom sampler with a ``__len__``: yields N-1 .. 0 and records ``set_epoch``."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.epochs: list[int] = []

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.n - 1, -1, -1))

    def __len__(self) -> int:
        return self.n

    def set_epoch(self, epoch: int) -> None:
        self.epochs.append(epoch)


def check_custom_sampler(fabric: Any) -> dict[str, Any]:
    fabric.seed_everything(1234)
    inner = ReversedSampler(N)
    floader = fabric.setup_dataloaders(DataLoader(list(range(N)), batch_size=4, sampler=inner))
    epochs = _epochs(floader, 2)
    return {
        **_sampler_facts(floader),
        "inner_is_ours": getattr(getattr(floader.sampler, "dataset", None), "sampler", None) is inner,
        "epochs": epochs,
        "inner_epochs": inner.epochs,
    }


class PairBatchSampler(BatchSampler):
    """A custom batch sampler with BatchSampler's arguments: made again around the distributed sampler."""


class EveryOtherBatchSampler:
    """A batch sampler that does not follow BatchSampler's arguments: it cannot be made again around another."""

    def __init__(self, size: int) -> None:
        self.size = size

    def __iter__(self) -> Iterator[list[int]]:
        return iter([[i, i + 1] for i in range(0, self.size, 2)])

    def __len__(self) -> int:
        return self.size // 2


def check_batch_sampler(fabric: Any) -> dict[str, Any]:
    dataset = list(range(N))
    loader = DataLoader(dataset, batch_sampler=PairBatchSampler(SequentialSampler(dataset), 2, False))
    floader = fabric.setup_dataloaders(loader)
    batch_sampler = floader._dataloader.batch_sampler
    odd = DataLoader(dataset, batch_sampler=EveryOtherBatchSampler(N))
    try:
        fabric.setup_dataloaders(odd)
    except TypeError as err:
        error = str(err)
    else:
        error = None
    kept = fabric.setup_dataloaders(odd, use_distributed_sampler=False)
    return {
        "batch_sampler": type(batch_sampler).__name__,
        "inner_sampler": type(batch_sampler.sampler).__name__,
        "batches": [[int(i) for i in batch] for batch in floader],
        "error": error,
        "kept_batch_sampler": type(kept.batch_sampler).__name__,
        "kept_epochs": _epochs(kept, 1),
    }


def check_no_distributed_sampler(fabric: Any) -> dict[str, Any]:
    loader = DataLoader(list(range(N)), batch_size=5, shuffle=True)
    original = loader.sampler
    floader = fabric.setup_dataloaders(loader, use_distributed_sampler=False)
    return {
        "sampler_kept": floader.sampler is original,
        "loader_kept": floader._dataloader is loader,
        "sorted_epoch": sorted(_epochs(floader, 1)[0]),
    }


class Stream(IterableDataset):  # type: ignore[type-arg]
    def __iter__(self) -> Iterator[int]:
        return iter(range(6))


def check_iterable(fabric: Any) -> dict[str, Any]:
    loader = DataLoader(Stream(), batch_size=2)
    floader = fabric.setup_dataloaders(loader)
    return {
        "loader_kept": floader._dataloader is loader,
        "sampler": type(floader.sampler).__name__,
        "epochs": _epochs(floader, 1),
    }


def check_already_distributed(fabric: Any) -> dict[str, Any]:
    dataset = list(range(N))
    sampler = DistributedSampler(dataset, num_replicas=2, rank=1 - fabric.global_rank, shuffle=False)
    loader = DataLoader(dataset, batch_size=5, sampler=sampler)
    floader = fabric.setup_dataloaders(loader)
    return {"loader_kept": floader._dataloader is loader, "epochs": _epochs(floader, 1)}


CHECKS: dict[str, Callable[[Any], dict[str, Any]]] = {
    "random": check_random,
    "sequential": check_sequential,
    "generator": check_generator,
    "workers": check_workers,
    "custom_sampler": check_custom_sampler,
    "batch_sampler": check_batch_sampler,
    "no_distributed_sampler": check_no_distributed_sampler,
    "iterable": check_iterable,
    "already_distributed": check_already_distributed,
}


def observe(fabric: Any) -> dict[str, Any]:
    results: dict[str, Any] = {"rank": fabric.global_rank, "world_size": fabric.world_size}
    for name, check in CHECKS.items():
        try:
            results[name] = check(fabric)
        except Exception:
            results[name] = {"traceback": traceback.format_exc()}
    return results
