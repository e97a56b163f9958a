"""Seeding of Python's, NumPy's and torch's random number generators, and of dataloader workers."""

from __future__ import annotations

import os
import random
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from fabric_lite._log import get_logger
from fabric_lite.utilities.rank_zero import _get_rank, rank_prefixed_message, rank_zero_only, rank_zero_warn

log = get_logger(__name__)

# Written by seed_everything for the processes started later; Lightning's names, so either library reads the seed
ENV_SEED = "PL_GLOBAL_SEED"
ENV_SEED_WORKERS = "PL_SEED_WORKERS"
#: fabric_lite's own names, read (never written) where Lightning's are unset
_READ_ALIASES = {ENV_SEED: "FABRIC_LITE_GLOBAL_SEED", ENV_SEED_WORKERS: "FABRIC_LITE_SEED_WORKERS"}
#: the range of seeds NumPy accepts (unsigned 32-bit), as in Lightning
max_seed_value = 4294967295
min_seed_value = 0
_MIN_SEED, _MAX_SEED = min_seed_value, max_seed_value


def _read(name: str) -> tuple[str, str] | None:
    """``(variable, value)`` of ``name`` or, where it is unset, of its read alias; ``None`` if neither is set."""
    for variable in (name, _READ_ALIASES[name]):
        value = os.environ.get(variable)
        if value is not None:
            return variable, value
    return None


def seed_everything(seed: int | None = None, workers: bool = False, verbose: bool = True) -> int:
    """Seed ``random``, NumPy and torch (all devices) with ``seed`` and return it; ``verbose`` logs it.

    ``seed`` (in ``[0, 2**32 - 1]``) and ``workers`` are written to ``PL_GLOBAL_SEED`` and ``PL_SEED_WORKERS``
    (Lightning's names), so that processes started later inherit them and ``setup_dataloaders`` seeds its samplers
    with them. ``seed=None`` reads ``PL_GLOBAL_SEED`` (or ``FABRIC_LITE_GLOBAL_SEED``), else uses 0.
    ``workers=True`` gives each worker of the loaders set up afterwards its own seed (from seed, worker id and rank).

    Raises:
        ValueError: the seed is not an integer in range, also when read from the environment.

    Example::

        seed_everything(42)
    """
    if seed is None:
        found = _read(ENV_SEED)
        if found is None:
            seed = 0
            if verbose:
                rank_zero_warn(f"No seed found, seed set to {seed}")
        else:
            variable, env_seed = found
            try:
                seed = int(env_seed)
            except ValueError:
                raise ValueError(
                    f"Invalid seed specified via {variable}: {env_seed!r}. Set it to an integer, or unset it."
                ) from None
    elif not isinstance(seed, int) or isinstance(seed, bool):
        try:
            seed = int(seed)
        except (TypeError, ValueError):
            raise ValueError(f"seed_everything(seed={seed!r}): the seed must be an integer, e.g. 42.") from None
    if not _MIN_SEED <= seed <= _MAX_SEED:
        raise ValueError(
            f"seed_everything(seed={seed}): {seed} is not in bounds, NumPy accepts {_MIN_SEED} to {_MAX_SEED}."
            f" Use e.g. seed % {_MAX_SEED + 1}."
        )
    if verbose:
        log.info(rank_prefixed_message(f"Seed set to {seed}", _get_rank()))
    os.environ[ENV_SEED] = str(seed)
    os.environ[ENV_SEED_WORKERS] = str(int(workers))
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    return seed


def reset_seed() -> None:
    """Seed every generator again as :func:`seed_everything` last did (in this process or an ancestor, read from the
    environment); nothing happens when it was never called.

    Raises:
        ValueError: ``PL_GLOBAL_SEED`` is not an integer in range.

    Example::

        reset_seed()
    """
    if _read(ENV_SEED) is None:
        return
    seed_everything(None, workers=seed_workers_requested(), verbose=False)  # an invalid value raises, naming it


def pl_worker_init_function(worker_id: int, rank: int | None = None) -> None:
    """Lightning's ``worker_init_fn``: seed torch, ``random`` and NumPy in a dataloader worker from the process's seed,
    the worker id and ``rank`` (default ``rank_zero_only.rank``), drawing the same numbers as Lightning.

    Example::

        DataLoader(dataset, num_workers=4, worker_init_fn=functools.partial(pl_worker_init_function, rank=1))
    """
    global_rank = rank if rank is not None else rank_zero_only.rank  # type: ignore[attr-defined]
    # torch seeds worker ``i`` with ``base_seed + i``: back out the base seed to use all of its bits
    base_seed = torch.initial_seed() - worker_id
    log.debug(
        "Initializing random number generators of process %s worker %d with base seed %d",
        global_rank,
        worker_id,
        base_seed,
    )
    seeds = _generate_seed_sequence(base_seed, worker_id, global_rank, count=4)
    torch.manual_seed(seeds[0])
    random.seed((seeds[1] << 32) | seeds[2])
    np.random.seed(np.random.SeedSequence([base_seed, worker_id, global_rank]).generate_state(4))


def _generate_seed_sequence(base_seed: int, worker_id: int, global_rank: int, count: int) -> list[int]:
    """``count`` 64-bit seeds from (base seed, worker id, rank), the same as Lightning's: a MurmurHash3 finalizer, then
    an LCG (Knuth's MMIX constants)."""
    mask = (1 << 64) - 1
    state = (base_seed << 32) | (worker_id << 16) | global_rank
    state ^= state >> 33
    state = (state * 0xFF51AFD7ED558CCD) & mask
    state ^= state >> 33
    state = (state * 0xC4CEB9FE1A85EC53) & mask
    state ^= state >> 33
    seeds = []
    for _ in range(count):
        state = (state * 6364136223846793005 + 1) & mask
        seeds.append(state)
    return seeds


def global_seed() -> int | None:
    """The seed :func:`seed_everything` set in this process or an ancestor (``PL_GLOBAL_SEED``), if any.

    Example::

        global_seed()  # 7 after seed_everything(7)
    """
    found = _read(ENV_SEED)
    try:
        return int(found[1]) if found is not None else None
    except ValueError:
        return None


def seed_workers_requested() -> bool:
    """Whether :func:`seed_everything` was called with ``workers=True`` (``PL_SEED_WORKERS=1``).

    Example::

        seed_workers_requested()  # True after seed_everything(7, workers=True)
    """
    found = _read(ENV_SEED_WORKERS)
    return found is not None and found[1] == "1"


def worker_init_function(worker_id: int, rank: int = 0) -> None:
    """Seed a dataloader worker: every (rank, worker) pair gets its own streams for torch, ``random`` and NumPy, the
    same ones in every run with the same seed.

    Example::

        DataLoader(dataset, num_workers=2, worker_init_fn=functools.partial(worker_init_function, rank=0))
    """
    base_seed = torch.initial_seed() - worker_id  # torch seeds each worker with base + worker_id
    sequence = np.random.SeedSequence([base_seed % 2**64, worker_id, rank])
    torch_seed, random_seed, *numpy_state = sequence.generate_state(6, dtype=np.uint64).tolist()
    torch.manual_seed(torch_seed)
    random.seed(random_seed)
    np.random.seed(np.array(numpy_state, dtype=np.uint64).view(np.uint32) if numpy_state else 0)


def _capture() -> dict[str, Any]:
    """This process's generator states, as plain values that ``torch.load(weights_only=True)`` accepts."""
    version, words, gauss = random.getstate()
    name, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)
    state: dict[str, Any] = {
        "python": [version, list(words), gauss],
        "numpy": [name, torch.from_numpy(np.asarray(keys, dtype=np.int64)), int(pos), int(has_gauss), float(cached)],
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _restore(state: dict[str, Any]) -> None:
    version, words, gauss = state["python"]
    random.setstate((version, tuple(words), gauss))
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _collect_rng_states(include_cuda: bool = True) -> dict[str, Any]:
    """The global random states in Lightning's private form (``"torch"``, ``"torch.cuda"``, ``"numpy"``, ``"python"``);
    its NumPy ``ndarray`` needs ``weights_only=False`` to load, unlike :class:`RandomState`'s plain values."""
    states: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "python": random.getstate(),
        "numpy": np.random.get_state(),
    }
    if include_cuda:
        states["torch.cuda"] = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []
    return states


def _set_rng_states(rng_state_dict: dict[str, Any]) -> None:
    """Restore what :func:`_collect_rng_states` returned."""
    torch.set_rng_state(rng_state_dict["torch"])
    if "torch.cuda" in rng_state_dict:
        torch.cuda.set_rng_state_all(rng_state_dict["torch.cuda"])
    if "numpy" in rng_state_dict:
        np.random.set_state(rng_state_dict["numpy"])
    version, state, gauss = rng_state_dict["python"]
    random.setstate((version, tuple(state), gauss))


def _rank_and_world_size() -> tuple[int, int]:
    """This process's rank and the default group's world size; ``(0, 1)`` without one."""
    return (dist.get_rank(), dist.get_world_size()) if dist.is_available() and dist.is_initialized() else (0, 1)


def _gather_per_rank(mine: Any) -> list[Any]:
    """Every process's ``mine``, in rank order; a collective with several processes."""
    world_size = _rank_and_world_size()[1]
    if world_size == 1:
        return [mine]
    everyone: list[Any] = [None] * world_size
    dist.all_gather_object(everyone, mine)
    return everyone


class RandomState:
    """Every process's random generators (Python, NumPy, torch, CUDA), as an object for ``fabric.save``/``fabric.load``.

    A resumed run then draws the same random numbers as one that never stopped. Saving gathers each process's states;
    loading gives each process its own. The values are plain, so the checkpoint loads with ``weights_only=True``.

    Example::

        state = {"model": model, "optimizer": optimizer, "rng": RandomState()}
        fabric.save("last.ckpt", state)
    """

    def state_dict(self) -> dict[str, Any]:
        """``{"per_rank": [...]}``, every process's states; a collective with several processes."""
        return {"per_rank": _gather_per_rank(_capture())}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore this process's generators from ``state_dict["per_rank"][rank]``.

        Raises:
            ValueError: the checkpoint was saved by fewer processes than there are now.
        """
        per_rank = state_dict["per_rank"]
        rank = _rank_and_world_size()[0]
        if rank >= len(per_rank):
            raise ValueError(
                f"The checkpoint holds random states for {len(per_rank)} process(es), but this is rank {rank}: it was"
                " saved with a different world size. Resume with the same number of processes, or leave the"
                " RandomState out of the state you load (and re-seed with seed_everything)."
            )
        _restore(per_rank[rank])
