"""Resuming a plain ``DataLoader`` inside an epoch, for the loader wrapper of ``Fabric.setup_dataloaders``. An epoch's
order is fixed by the random states at its start, so those are kept (:class:`EpochStart`) and a resume replays them,
skipping the batches already given as indices (:class:`SkipBatches`: no sample is read), then puts the global state
back. The user's loader is never modified."""

from __future__ import annotations

import copy
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import DataLoader, IterableDataset

#: written in the loader state, so that a later version knows which form it reads
FORMAT = 1


def _sampler_generators(loader: DataLoader[Any]) -> list[torch.Generator]:
    """The generators of the loader's sampler and batch sampler's sampler other than ``loader.generator``."""
    found: list[torch.Generator] = []
    for sampler in (loader.sampler, getattr(loader.batch_sampler, "sampler", None)):
        generator = getattr(sampler, "generator", None)
        if isinstance(generator, torch.Generator) and generator is not loader.generator and generator not in found:
            found.append(generator)
    return found


@dataclass
class EpochStart:
    """The random states that decide an epoch's order: the global torch generator, the loader's and the
    samplers' own generators, taken just before ``iter(loader)``."""

    torch_state: torch.Tensor
    loader_generator: torch.Tensor | None
    sampler_generators: list[torch.Tensor]

    @classmethod
    def capture(cls, loader: DataLoader[Any]) -> EpochStart:
        generator = loader.generator
        return cls(
            torch.get_rng_state(),
            None if generator is None else generator.get_state(),
            [g.get_state() for g in _sampler_generators(loader)],
        )

    def apply(self, loader: DataLoader[Any]) -> None:
        """Put every generator back to its state at the epoch start. Raises ``ValueError`` when the loader's
        generators are not those the states were taken from (the script changed between the runs)."""
        generators = _sampler_generators(loader)
        if (self.loader_generator is None) != (loader.generator is None) or len(generators) != len(
            self.sampler_generators
        ):
            raise ValueError("the loader's generators differ from those of the saved run")
        torch.set_rng_state(self.torch_state)
        if loader.generator is not None and self.loader_generator is not None:
            loader.generator.set_state(self.loader_generator)
        for generator, state in zip(generators, self.sampler_generators, strict=True):
            generator.set_state(state)

    def to_state(self) -> dict[str, Any]:
        return {
            "torch": self.torch_state,
            "loader_generator": self.loader_generator,
            "sampler_generators": list(self.sampler_generators),
        }

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> EpochStart:
        return cls(state["torch"], state["loader_generator"], list(state["sampler_generators"]))


class SkipBatches:
    """A loader's index sampler in a resumed epoch: the first ``skip`` batches of indices are drawn and dropped, at
    :meth:`prime` or the first index asked for, so the sampler draws where the original epoch did."""

    def __init__(self, inner: Any, skip: int) -> None:
        self.inner = inner
        self.skip = skip
        self._iterator: Iterator[Any] | None = None

    def prime(self) -> None:
        if self._iterator is not None:
            return
        self._iterator = iter(self.inner)
        for _ in range(self.skip):
            if next(self._iterator, _END) is _END:
                break

    def __iter__(self) -> Iterator[Any]:
        self.prime()
        assert self._iterator is not None
        yield from self._iterator

    def __len__(self) -> int:
        return max(len(self.inner) - self.skip, 0)

    def __getattr__(self, name: str) -> Any:  # batch_size, drop_last, sampler: the inner sampler's
        if name in ("inner", "skip", "_iterator"):
            raise AttributeError(name)
        return getattr(self.inner, name)


_END = object()


def can_resume(loader: object) -> bool:
    """Whether :func:`resume_iterator` can skip inside an epoch of ``loader``: a ``DataLoader`` over a map-style
    dataset (an ``IterableDataset`` has no sampler to skip in)."""
    return isinstance(loader, DataLoader) and not isinstance(loader.dataset, IterableDataset)


def resume_iterator(loader: DataLoader[Any], start: EpochStart, skip: int) -> Iterator[Any] | None:
    """An iterator over the epoch that began at ``start``, from batch ``skip`` on, with the global torch state left as
    it is now; ``None``, with a warning, when the loader cannot be replayed."""
    skipper = SkipBatches(loader.batch_sampler if loader.batch_sampler is not None else loader.sampler, skip)
    try:
        view = copy.copy(loader)  # DataLoader has no __setstate__: a copy of its __dict__
        vars(view)["batch_sampler" if loader.batch_sampler is not None else "sampler"] = skipper
        vars(view)["_iterator"] = None
        now = torch.get_rng_state()
        start.apply(loader)
    except Exception as err:  # an exotic DataLoader subclass, or another script
        warnings.warn(
            f"The dataloader cannot resume inside its epoch ({err}): the epoch restarts from its first batch.",
            UserWarning,
            stacklevel=3,
        )
        return None
    try:
        iterator = iter(view)  # draws the workers' base seed, as the original iter(loader) did
        skipper.prime()  # the sampler's draws, then the skip (workers may have done it already)
    finally:
        torch.set_rng_state(now)
    return iterator
