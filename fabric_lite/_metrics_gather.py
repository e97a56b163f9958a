"""``Fabric.gather_for_metrics``: gather per-sample results from every process, without the padded duplicates.
A ``DistributedSampler`` gives rank ``r`` of ``W`` the positions ``r, r + W, ...`` of an index list padded past the
``N`` samples: interleaving the ranks' rows restores its order, and keeping positions below ``N`` drops the padding."""

from __future__ import annotations

import weakref
from collections.abc import Iterable, Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor
from torch.utils.data import DataLoader, DistributedSampler

from fabric_lite.runtime import collectives
from fabric_lite.strategies.strategy import Strategy
from fabric_lite.utilities._tree import flatten, unflatten
from fabric_lite.wrappers import _FabricDataLoader


class LoaderRegistry:
    """The loaders a ``Fabric`` set up, held weakly. Pickles empty: a spawned process sets up its own loaders."""

    def __init__(self) -> None:
        self._loaders: weakref.WeakSet[_FabricDataLoader] = weakref.WeakSet()

    def add(self, loaders: Iterable[_FabricDataLoader]) -> None:
        self._loaders.update(loaders)

    def __iter__(self) -> Iterator[_FabricDataLoader]:
        return iter(list(self._loaders))

    def __getstate__(self) -> dict[str, Any]:
        return {}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._loaders = weakref.WeakSet()


def _inner(loader: Any) -> Any:
    return loader._dataloader if isinstance(loader, _FabricDataLoader) else loader


def _distributed_sampler(loader: Any) -> DistributedSampler[Any] | None:
    inner = _inner(loader)
    for sampler in (getattr(inner, "sampler", None), getattr(getattr(inner, "batch_sampler", None), "sampler", None)):
        if isinstance(sampler, DistributedSampler):
            return sampler
    return None


def _batch_size(loader: Any) -> int | None:
    inner = _inner(loader)
    size = getattr(inner, "batch_size", None)
    if size is None:
        size = getattr(getattr(inner, "batch_sampler", None), "batch_size", None)
    return size if isinstance(size, int) else None


def _pick_loader(dataloader: Any, candidates: Iterable[_FabricDataLoader]) -> Any:
    if dataloader is not None:
        if not isinstance(dataloader, (_FabricDataLoader, DataLoader)):
            raise TypeError(
                f"gather_for_metrics(dataloader=...) expects the loader returned by fabric.setup_dataloaders (or a"
                f" DataLoader), got {type(dataloader).__name__}."
            )
        return dataloader
    iterating = [loader for loader in candidates if loader._batch_index is not None]
    if len(iterating) == 1:
        return iterating[0]
    reason = (
        f"{len(iterating)} loaders set up by this Fabric are being iterated"
        if iterating
        else "no loader set up by this Fabric is being iterated"
    )
    raise ValueError(
        f"fabric.gather_for_metrics(data) cannot tell which dataloader the data comes from: {reason}. Pass it:"
        " fabric.gather_for_metrics(data, dataloader=val_loader)."
    )


def _rows(tensors: list[Tensor]) -> int:
    rows = {t.shape[0] if t.dim() > 0 else None for t in tensors}
    if None in rows or len(rows) != 1:
        shapes = [tuple(t.shape) for t in tensors]
        raise ValueError(
            "gather_for_metrics gathers per-sample results: every tensor needs the same first (batch) dimension, got"
            f" shapes {shapes}. Reduce scalars such as a batch's loss with fabric.all_reduce instead."
        )
    return int(rows.pop())  # type: ignore[arg-type]


def gather_for_metrics(data: Any, strategy: Strategy, dataloader: Any, candidates: Iterable[_FabricDataLoader]) -> Any:
    """See :meth:`fabric_lite.Fabric.gather_for_metrics`."""
    if strategy.world_size == 1 or not (dist.is_available() and dist.is_initialized()):
        return data
    leaves, spec = flatten(data)
    positions = [i for i, leaf in enumerate(leaves) if isinstance(leaf, Tensor)]
    if not positions:
        return data
    tensors = [leaves[i] for i in positions]
    rows = _rows(tensors)
    loader = _pick_loader(dataloader, candidates)
    sampler = _distributed_sampler(loader)
    if sampler is None:
        # not split by a DistributedSampler (an iterable dataset, use_distributed_sampler=False): nothing is padded
        # that we could recognise, so every rank's rows are kept, rank after rank
        gathered = [torch.cat(collectives.gather_uneven(t, None)) for t in tensors]
    else:
        gathered = _gather_interleaved(tensors, rows, loader, sampler, strategy)
    for i, value in zip(positions, gathered, strict=True):
        leaves[i] = value
    return unflatten(spec, leaves)


def _gather_interleaved(
    tensors: list[Tensor], rows: int, loader: Any, sampler: DistributedSampler[Any], strategy: Strategy
) -> list[Tensor]:
    world_size = sampler.num_replicas
    if world_size != strategy.world_size:
        raise ValueError(
            f"The dataloader's DistributedSampler splits the data over num_replicas={world_size} processes, but"
            f" there are {strategy.world_size}. Let fabric.setup_dataloaders create the sampler."
        )
    num_samples = sampler.num_samples  # per rank, padding included
    batch_index = loader._batch_index if isinstance(loader, _FabricDataLoader) else None
    if batch_index is not None:
        # called for the batch being processed: rank r's rows are its samples offset ... offset + rows - 1
        batch_size = _batch_size(loader)
        if batch_size is None:
            raise ValueError(
                "gather_for_metrics needs a dataloader with a fixed batch_size to place each batch's samples; this"
                " one has none. Collect the per-sample results of the whole epoch and call"
                " fabric.gather_for_metrics(results, dataloader=loader) after the loop."
            )
        offset = batch_index * batch_size
        expected = min(batch_size, num_samples - offset)
        if rows != expected:
            raise ValueError(
                f"gather_for_metrics was called during batch {batch_index} of the dataloader, which holds {expected}"
                f" samples on this process, but the data has {rows} rows. Pass this batch's per-sample results"
                " (first dimension = the batch), or call it after the loop with the results of the whole epoch."
            )
    else:
        # called outside the loop: the results of the epoch so far, from its first sample on
        offset = 0
        if rows > num_samples:
            raise ValueError(
                f"gather_for_metrics got {rows} rows, but this process draws only {num_samples} samples per epoch"
                " from its DistributedSampler. Pass the per-sample results of one epoch."
            )
    gathered = strategy.all_gather(tensors)
    # positions past the dataset's end are the sampler's padding (none with drop_last=True, which drops instead)
    limit = min(len(sampler.dataset), sampler.total_size)  # type: ignore[arg-type]
    keep = max(0, min(rows * world_size, limit - offset * world_size))
    # (world_size, rows, ...) -> rank 0's first row, rank 1's first row, ...: the sampler's order
    return [value.transpose(0, 1).reshape(rows * world_size, *value.shape[2:])[:keep] for value in gathered]
