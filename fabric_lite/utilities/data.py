"""Dataloader helpers: distributed samplers, re-creating a loader with a new sampler, lengths, worker counts, and
``AttributeDict`` (the public names of Lightning Fabric's ``utilities.data``); and ``SeedPerSample``, per-sample
random streams for augmentation that survives a resume inside an epoch.

Example::

    from fabric_lite.utilities.data import AttributeDict, suggested_max_num_workers

    state = AttributeDict(model=model, step=0)
    loader = DataLoader(dataset, num_workers=suggested_max_num_workers(fabric.world_size))
"""

from __future__ import annotations

import functools
import inspect
import random
from collections.abc import Sized
from typing import Any, TypeGuard

import numpy as np
import torch
from torch.utils.data import (
    BatchSampler,
    DataLoader,
    Dataset,
    DistributedSampler,
    IterableDataset,
    RandomSampler,
    Sampler,
    SequentialSampler,
    get_worker_info,
)

from fabric_lite.utilities.distributed import DistributedSamplerWrapper, _num_cpus_available
from fabric_lite.utilities.exceptions import MisconfigurationException
from fabric_lite.utilities.rank_zero import rank_zero_warn
from fabric_lite.utilities.seed import (
    global_seed,
    pl_worker_init_function,
    seed_workers_requested,
    worker_init_function,
)

__all__ = [
    "AttributeDict",
    "DistributedSamplerWrapper",
    "MisconfigurationException",
    "SeedPerSample",
    "get_all_subclasses",
    "has_iterable_dataset",
    "has_len",
    "pl_worker_init_function",
    "sized_len",
    "suggested_max_num_workers",
]


def has_iterable_dataset(dataloader: object) -> bool:
    """Whether ``dataloader`` has a ``dataset`` attribute that is an ``IterableDataset``.

    Example::

        has_iterable_dataset(DataLoader(range(4)))  # False
    """
    return isinstance(getattr(dataloader, "dataset", None), IterableDataset)


def sized_len(dataloader: object) -> int | None:
    """``len(dataloader)``, or ``None`` when it has no length (``TypeError`` or ``NotImplementedError``).

    Example::

        >>> sized_len([1, 2, 3]), sized_len(iter([1, 2, 3]))
        (3, None)
    """
    try:
        return len(dataloader)  # type: ignore[arg-type]
    except (TypeError, NotImplementedError):
        return None


def has_len(dataloader: object) -> TypeGuard[Sized]:
    """Whether ``dataloader`` has a length; warns (on rank 0) when the length is 0, or when an ``IterableDataset``
    has one (with several workers it may be wrong unless each worker skips the others' data).

    Example::

        has_len(DataLoader(range(4)))  # True
    """
    length = sized_len(dataloader)
    if length == 0:
        rank_zero_warn(f"`{type(dataloader).__name__}` returned 0 length. Please make sure this was your intention.")
    if length is not None and has_iterable_dataset(dataloader):
        rank_zero_warn(
            "Your `IterableDataset` has `__len__` defined. In combination with multi-process data loading (when"
            " num_workers > 1), `__len__` could be inaccurate if each worker is not configured independently to"
            " avoid having duplicate data."
        )
    return length is not None


def suggested_max_num_workers(local_world_size: int) -> int:
    """An upper bound for ``DataLoader(num_workers=...)``: the CPU cores this process may use, divided among the
    ``local_world_size`` processes of this machine, minus one for each main process (at least 1).

    Raises:
        ValueError: ``local_world_size < 1``.

    Example::

        num_workers = suggested_max_num_workers(fabric.world_size // fabric.num_nodes)  # 7 with 16 cores, 2 GPUs
    """
    if local_world_size < 1:
        raise ValueError(f"`local_world_size` should be >= 1, got {local_world_size}.")
    return max(1, _num_cpus_available() // local_world_size - 1)


def get_all_subclasses(cls: type) -> set[type]:
    """Every direct and indirect subclass of ``cls`` (defined so far).

    Example::

        >>> class A: ...
        >>> class B(A): ...
        >>> class C(B): ...
        >>> sorted(c.__name__ for c in get_all_subclasses(A))
        ['B', 'C']
    """
    found: set[type] = set()
    pending: list[type] = [cls]
    while pending:
        subclasses: list[type] = pending.pop().__subclasses__()
        for subclass in subclasses:
            if subclass not in found:
                found.add(subclass)
                pending.append(subclass)
    return found


class AttributeDict(dict[str, Any]):
    """A ``dict`` whose keys are also attributes: ``state.step += 1`` is ``state["step"] += 1``.

    Handy for the state passed to ``fabric.save``/``fabric.load``. Its repr lists one key per line, sorted.

    Example::

        >>> state = AttributeDict(step=0, lr=0.1)
        >>> state.step += 1
        >>> state["step"]
        1
        >>> state
        "lr":   0.1
        "step": 1
    """

    def __getattr__(self, key: str) -> Any:
        try:
            return self[key]
        except KeyError as err:
            raise AttributeError(f"'{type(self).__name__}' object has no attribute '{key}'") from err

    def __setattr__(self, key: str, val: Any) -> None:
        self[key] = val

    def __delattr__(self, item: str) -> None:
        if item not in self:
            raise KeyError(item)
        del self[item]

    def __repr__(self) -> str:
        if not self:
            return ""
        width = max(len(str(k)) for k in self) + 3
        labels = {k: f'"{k}":' for k in self}
        return "\n".join(f"{labels[k]:{width}s} {self[k]}" for k in sorted(self.keys()))


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
    # the wrapped sampler already decides the order: keep it (DistributedSampler would shuffle by default)
    return DistributedSamplerWrapper(sampler, num_replicas=num_replicas, rank=rank, shuffle=False, seed=seed)


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


class SeedPerSample(Dataset[Any]):
    """A map-style dataset whose every sample draws its random numbers from a stream of its own, seeded from
    ``(seed, epoch, index)``: random augmentation then gives the same result whichever worker reads the sample,
    and so also after a resume inside an epoch (where the batches fall to other workers than in the original run).

    Off by default, as an explicit wrapper: it changes the numbers a script prints, since augmentation no longer
    draws from the workers' own streams. Before each call it seeds torch, ``random`` and NumPy; in the main process
    (``num_workers=0``) it puts their states back after the call, so that the model's draws (dropout) are not
    disturbed, at a cost of some 10-20 µs a sample. A loader from ``Fabric.setup_dataloaders`` sets its epoch at
    each new iteration; ``persistent_workers=True`` is refused there (the workers would keep their first epoch).

    Args:
        dataset: the map-style dataset; its ``__getitem__`` is called one index at a time.
        seed: the base seed; by default the one given to ``seed_everything``, else 0.

    Example::

        loader = DataLoader(SeedPerSample(AugmentedImages(...)), batch_size=32, shuffle=True, num_workers=4)
        loader = fabric.setup_dataloaders(loader)
    """

    def __init__(self, dataset: Dataset[Any], seed: int | None = None) -> None:
        self.dataset = dataset
        self.seed = seed
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]

    def __getitem__(self, index: int) -> Any:
        base = self.seed if self.seed is not None else (global_seed() or 0)
        words = np.random.SeedSequence([base % 2**64, self.epoch, int(index)]).generate_state(4, dtype=np.uint64)
        in_main_process = get_worker_info() is None
        if in_main_process:
            saved = (torch.get_rng_state(), random.getstate(), np.random.get_state())
        torch.manual_seed(int(words[0]))
        random.seed(int(words[1]))
        np.random.seed(words[2:].view(np.uint32))
        try:
            return self.dataset[index]
        finally:
            if in_main_process:
                torch.set_rng_state(saved[0])
                random.setstate(saved[1])
                np.random.set_state(saved[2])
