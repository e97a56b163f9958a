"""Dataloader helpers under the public names of Lightning Fabric's ``utilities.data`` (re-creating a loader lives in
:mod:`fabric_lite.utilities._recreate`), and :class:`SeedPerSample`."""

from __future__ import annotations

import functools
import os  # noqa: F401  Lightning's path: its tests patch utilities.data.os to set the CPU count
import random
from collections.abc import Sized
from typing import Any, TypeGuard

import numpy as np
import torch
from torch.utils.data import (
    DataLoader,
    Dataset,
    DistributedSampler,
    IterableDataset,
    RandomSampler,
    SequentialSampler,
    get_worker_info,
)

# Lightning's names in this module
from fabric_lite.utilities._recreate import _get_dataloader_init_args_and_kwargs as _get_dataloader_init_args_and_kwargs
from fabric_lite.utilities._recreate import _replace_dunder_methods as _replace_dunder_methods
from fabric_lite.utilities._recreate import _replace_value_in_saved_args as _replace_value_in_saved_args
from fabric_lite.utilities._recreate import _update_dataloader, get_all_subclasses
from fabric_lite.utilities._recreate import _WrapAttrTag as _WrapAttrTag
from fabric_lite.utilities.distributed import DistributedSamplerWrapper, _num_cpus_available
from fabric_lite.utilities.exceptions import MisconfigurationException
from fabric_lite.utilities.rank_zero import rank_zero_warn
from fabric_lite.utilities.seed import (
    global_seed,
    pl_worker_init_function,
    seed_workers_requested,
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
    """Whether ``dataloader.dataset`` is an ``IterableDataset``.

    Example::

        has_iterable_dataset(DataLoader(range(4)))  # False
    """
    return isinstance(getattr(dataloader, "dataset", None), IterableDataset)


def sized_len(dataloader: object) -> int | None:
    """``len(dataloader)``, or ``None`` when it has none (``TypeError`` or ``NotImplementedError``).

    Example::

        >>> sized_len([1, 2, 3]), sized_len(iter([1, 2, 3]))
        (3, None)
    """
    try:
        return len(dataloader)  # type: ignore[arg-type]
    except (TypeError, NotImplementedError):
        return None


def has_len(dataloader: object) -> TypeGuard[Sized]:
    """Whether ``dataloader`` has a length; warns on rank 0 when it is 0, or when an ``IterableDataset`` has one (with
    several workers it may be wrong).

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
    """An upper bound for ``num_workers``: this process's CPU cores shared among the ``local_world_size`` processes of
    the machine, minus one for each main process (at least 1).

    Raises:
        ValueError: ``local_world_size < 1``.

    Example::

        num_workers = suggested_max_num_workers(fabric.world_size // fabric.num_nodes)
    """
    if local_world_size < 1:
        raise ValueError(f"`local_world_size` should be >= 1, got {local_world_size}.")
    return max(1, _num_cpus_available() // local_world_size - 1)


class AttributeDict(dict[str, Any]):
    """A ``dict`` whose keys are also attributes; its repr lists one key per line, sorted.

    Example::

        >>> state = AttributeDict(step=0)
        >>> state.step += 1
        >>> state["step"]
        1
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
    """A ``DistributedSampler`` that keeps the loader's shuffling (a ``RandomSampler``) and seed.

    The seed is the loader's ``generator``'s, else ``seed_everything``'s, else 0: every process must use the same,
    so that the shards do not overlap. Any other sampler is wrapped in :class:`DistributedSamplerWrapper`, in its order.
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


#: ``setup_dataloaders``' name for :func:`_update_dataloader`: the loader made again around a new sampler
replace_sampler = _update_dataloader


def _set_sampler_epoch(dataloader: object, epoch: int) -> None:
    """Call ``set_epoch(epoch)`` on the loader's sampler and its batch sampler's (once if the same), where defined."""
    sampler = getattr(dataloader, "sampler", None)
    inner = getattr(getattr(dataloader, "batch_sampler", None), "sampler", None)
    for target in (sampler, None if inner is sampler else inner):
        set_epoch = getattr(target, "set_epoch", None)
        if callable(set_epoch):
            set_epoch(epoch)


def add_worker_init_fn(dataloader: DataLoader[Any], rank: int) -> None:
    """Give the loader Lightning's :func:`pl_worker_init_function` when ``seed_everything(workers=True)`` asked for it
    and the loader has no ``worker_init_fn``."""
    if dataloader.worker_init_fn is None and seed_workers_requested():
        dataloader.worker_init_fn = functools.partial(pl_worker_init_function, rank=rank)


class SeedPerSample(Dataset[Any]):
    """A map-style dataset whose every sample draws from a random stream of its own, seeded by ``(seed, epoch, index)``.

    Random augmentation then gives the same result whichever worker reads the sample, also after a resume inside an
    epoch. Opt-in, as it changes the numbers a script draws. In the main process (``num_workers=0``) the generators'
    states are restored after each sample, so that the model's draws are undisturbed. ``seed`` defaults to
    ``seed_everything``'s, else 0. ``setup_dataloaders`` sets the epoch, and refuses ``persistent_workers=True``
    (whose workers would keep their first epoch).

    Example::

        loader = DataLoader(SeedPerSample(AugmentedImages(...)), batch_size=32, shuffle=True, num_workers=4)
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
