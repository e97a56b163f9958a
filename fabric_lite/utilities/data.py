"""Dataloader helpers: distributed samplers and re-creating a loader with a new sampler."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Iterator, Sized
from typing import Any

from torch.utils.data import (
    BatchSampler,
    DataLoader,
    DistributedSampler,
    IterableDataset,
    RandomSampler,
    Sampler,
    SequentialSampler,
)

from fabric_lite.utilities.seed import global_seed, seed_workers_requested, worker_init_function


def has_iterable_dataset(dataloader: DataLoader[Any]) -> bool:
    return isinstance(getattr(dataloader, "dataset", None), IterableDataset)


class _SamplerIndices(Sized):
    """The indices a sampler yields, drawn afresh at every new iteration."""

    def __init__(self, sampler: Sampler[Any]) -> None:
        if not isinstance(sampler, Sized):
            raise TypeError(
                f"The dataloader's sampler {type(sampler).__name__} has no __len__, so it cannot be split across"
                " processes. Give it a __len__, or pass use_distributed_sampler=False to setup_dataloaders and"
                " split the data yourself."
            )
        self.sampler = sampler
        self.indices: list[Any] = []

    def __len__(self) -> int:
        return len(self.sampler)

    def __getitem__(self, i: int) -> Any:
        return self.indices[i]


class DistributedSamplerWrapper(DistributedSampler):  # type: ignore[type-arg]
    """Splits the indices of any sampler (with a ``__len__``) across processes, like ``DistributedSampler``.

    The wrapped sampler decides order and randomness; ``set_epoch`` is forwarded to it where it has one.
    """

    def __init__(self, sampler: Sampler[Any], **kwargs: Any) -> None:
        kwargs["shuffle"] = False  # the wrapped sampler already decides the order
        super().__init__(_SamplerIndices(sampler), **kwargs)  # type: ignore[arg-type]

    def __iter__(self) -> Iterator[Any]:
        source: _SamplerIndices = self.dataset  # type: ignore[assignment]
        source.indices = list(source.sampler)
        return (source.indices[i] for i in super().__iter__())

    def set_epoch(self, epoch: int) -> None:
        super().set_epoch(epoch)
        inner = getattr(self.dataset.sampler, "set_epoch", None)  # type: ignore[attr-defined]
        if callable(inner):
            inner(epoch)


def distributed_sampler(dataloader: DataLoader[Any], num_replicas: int, rank: int) -> DistributedSampler:  # type: ignore[type-arg]
    """A ``DistributedSampler`` that keeps the loader's shuffling and seed.

    ``shuffle`` is on when the loader shuffled (a ``RandomSampler``). The seed is the seed of the loader's own
    ``generator`` when it has one, else the seed given to ``seed_everything``, else 0; every process must use the
    same seed, so that their shards do not overlap.
    """
    sampler = dataloader.sampler
    generator = getattr(sampler, "generator", None) or dataloader.generator
    seed = generator.initial_seed() if generator is not None else (global_seed() or 0)
    if isinstance(sampler, (RandomSampler, SequentialSampler)):
        return DistributedSampler(
            dataloader.dataset,
            num_replicas=num_replicas,
            rank=rank,
            shuffle=isinstance(sampler, RandomSampler),
            seed=seed,
        )
    return DistributedSamplerWrapper(sampler, num_replicas=num_replicas, rank=rank, seed=seed)  # type: ignore[arg-type]


_LOADER_ARGS = (
    "num_workers",
    "collate_fn",
    "pin_memory",
    "timeout",
    "worker_init_fn",
    "multiprocessing_context",
    "generator",
    "prefetch_factor",
    "persistent_workers",
    "pin_memory_device",
    "in_order",
)


def replace_sampler(dataloader: DataLoader[Any], sampler: Sampler[Any]) -> DataLoader[Any]:
    """A new loader like ``dataloader`` (same batch size, drop_last, workers, collate_fn, ...) that draws from
    ``sampler``.

    Raises:
        TypeError: the loader uses a custom batch sampler, or is a subclass whose constructor does not take the
            standard ``DataLoader`` arguments; the message says to pass ``use_distributed_sampler=False``.
    """
    batch_sampler = dataloader.batch_sampler
    if batch_sampler is not None and type(batch_sampler) is not BatchSampler:
        raise TypeError(
            f"The dataloader uses a custom batch sampler ({type(batch_sampler).__name__}), which fabric_lite cannot"
            " split across processes for you. Pass use_distributed_sampler=False to setup_dataloaders and give the"
            " batch sampler a DistributedSampler yourself."
        )
    batch_size, drop_last = dataloader.batch_size, dataloader.drop_last
    if batch_sampler is not None and dataloader.batch_size is None:
        # built with batch_sampler=BatchSampler(...): torch leaves batch_size=None, the batching lives there
        batch_size, drop_last = batch_sampler.batch_size, batch_sampler.drop_last
    kwargs: dict[str, Any] = {
        "dataset": dataloader.dataset,
        "batch_size": batch_size,
        "sampler": sampler,
        "drop_last": drop_last,
    }
    accepted = inspect.signature(DataLoader.__init__).parameters
    for name in _LOADER_ARGS:
        if name in accepted and hasattr(dataloader, name):
            kwargs[name] = getattr(dataloader, name)
    cls = type(dataloader)
    try:
        return cls(**kwargs)
    except TypeError as err:
        raise TypeError(
            f"fabric_lite could not re-create your {cls.__name__} with a distributed sampler ({err}). Pass"
            " use_distributed_sampler=False to setup_dataloaders and give the loader a DistributedSampler yourself."
        ) from err


def add_worker_init_fn(dataloader: DataLoader[Any], rank: int) -> None:
    """Give the loader's workers distinct seeds when ``seed_everything(workers=True)`` asked for it."""
    if dataloader.worker_init_fn is None and seed_workers_requested():
        dataloader.worker_init_fn = functools.partial(worker_init_function, rank=rank)
