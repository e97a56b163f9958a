"""Seeding of Python's, NumPy's and torch's random number generators, and of dataloader workers."""

from __future__ import annotations

import logging
import os
import random

import numpy as np
import torch

log = logging.getLogger(__name__)

# Written by seed_everything so that processes started later (script re-run, spawn, dataloader workers) see it.
ENV_SEED = "FABRIC_LITE_GLOBAL_SEED"
ENV_SEED_WORKERS = "FABRIC_LITE_SEED_WORKERS"
_MIN_SEED, _MAX_SEED = 0, 2**32 - 1  # NumPy's accepted range


def seed_everything(seed: int | None = None, workers: bool = False, verbose: bool = True) -> int:
    """Seed ``random``, NumPy and torch (all devices) with ``seed`` and return it.

    The seed is also written to the ``FABRIC_LITE_GLOBAL_SEED`` environment variable, so that processes started
    afterwards inherit it and ``setup_dataloaders`` seeds its ``DistributedSampler`` with it.

    Args:
        seed: an integer in ``[0, 2**32 - 1]``. ``None`` reads ``FABRIC_LITE_GLOBAL_SEED``, or uses 0 if unset.
        workers: also give every dataloader worker of loaders set up afterwards its own seed, derived from the
            seed, the worker id and the global rank (via a ``worker_init_fn``, unless the loader has one).
        verbose: log the seed at INFO level.

    Raises:
        ValueError: the seed is out of range or not an integer.

    Example::

        from fabric_lite import seed_everything
        seed_everything(42)
    """
    if seed is None:
        env_seed = os.environ.get(ENV_SEED)
        if env_seed is None:
            seed = 0
        else:
            try:
                seed = int(env_seed)
            except ValueError:
                raise ValueError(f"Invalid seed in {ENV_SEED}: {env_seed!r}. Set it to an integer.") from None
    elif not isinstance(seed, int) or isinstance(seed, bool):
        try:
            seed = int(seed)
        except (TypeError, ValueError):
            raise ValueError(f"seed_everything(seed={seed!r}): the seed must be an integer, e.g. 42.") from None
    if not _MIN_SEED <= seed <= _MAX_SEED:
        raise ValueError(
            f"seed_everything(seed={seed}) is out of range: NumPy accepts {_MIN_SEED} to {_MAX_SEED}."
            f" Use e.g. seed % {_MAX_SEED + 1}."
        )
    if verbose:
        log.info("Seed set to %d", seed)
    os.environ[ENV_SEED] = str(seed)
    os.environ[ENV_SEED_WORKERS] = str(int(workers))
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    return seed


def global_seed() -> int | None:
    """The seed set by :func:`seed_everything` in this process or an ancestor, if any."""
    value = os.environ.get(ENV_SEED)
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def seed_workers_requested() -> bool:
    """Whether :func:`seed_everything` was called with ``workers=True``."""
    return os.environ.get(ENV_SEED_WORKERS) == "1"


def worker_init_function(worker_id: int, rank: int = 0) -> None:
    """Seed a dataloader worker from the process's seed, the worker id and the global rank.

    Every (rank, worker) pair gets different streams for torch, ``random`` and NumPy, and the same ones on every
    run with the same seed.
    """
    base_seed = torch.initial_seed() - worker_id  # torch seeds each worker with base + worker_id
    sequence = np.random.SeedSequence([base_seed % 2**64, worker_id, rank])
    torch_seed, random_seed, *numpy_state = sequence.generate_state(6, dtype=np.uint64).tolist()
    torch.manual_seed(torch_seed)
    random.seed(random_seed)
    np.random.seed(np.array(numpy_state, dtype=np.uint64).view(np.uint32) if numpy_state else 0)
