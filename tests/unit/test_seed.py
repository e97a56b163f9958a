"""``seed_everything`` and the per-worker seeding of dataloader workers."""

from __future__ import annotations

import functools
import itertools
import os
import random

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from fabric_lite import Fabric, seed_everything
from fabric_lite.utilities.seed import (
    ENV_SEED,
    ENV_SEED_WORKERS,
    global_seed,
    reset_seed,
    seed_workers_requested,
    worker_init_function,
)

_ENV_AT_IMPORT = (os.environ.get(ENV_SEED), os.environ.get(ENV_SEED_WORKERS))


@pytest.fixture
def no_seed(monkeypatch):
    for name in (ENV_SEED, ENV_SEED_WORKERS, "FABRIC_LITE_GLOBAL_SEED", "FABRIC_LITE_SEED_WORKERS"):
        monkeypatch.delenv(name, raising=False)


def _draw():
    return torch.rand(3).tolist(), random.random(), np.random.rand(2).tolist()


def test_returns_the_seed_and_makes_every_generator_reproducible(no_seed):
    assert seed_everything(42) == 42
    first = _draw()
    assert seed_everything(42) == 42
    assert _draw() == first
    seed_everything(43)
    other = _draw()
    assert all(a != b for a, b in zip(first, other))


def test_matches_seeding_each_library_by_hand(no_seed):
    seed_everything(7)
    ours = _draw()
    torch.manual_seed(7)
    random.seed(7)
    np.random.seed(7)
    assert _draw() == ours


def test_writes_the_environment_variables(no_seed):
    seed_everything(1234)
    assert os.environ[ENV_SEED] == "1234" and global_seed() == 1234
    assert os.environ[ENV_SEED_WORKERS] == "0"
    seed_everything(5, workers=True)
    assert os.environ[ENV_SEED] == "5" and os.environ[ENV_SEED_WORKERS] == "1"


def test_lightning_variables_are_read_and_written(no_seed, monkeypatch):
    # a job started with PL_GLOBAL_SEED=2020 is seeded with 2020, as under Lightning; only Lightning's two names are
    # written (Lightning's own test suite fails a test that leaves any other variable behind)
    assert (ENV_SEED, ENV_SEED_WORKERS) == ("PL_GLOBAL_SEED", "PL_SEED_WORKERS")
    monkeypatch.setenv("PL_GLOBAL_SEED", "2020")
    before = set(os.environ)
    assert seed_everything() == 2020
    assert set(os.environ) - before == {"PL_SEED_WORKERS"}
    assert (os.environ["PL_GLOBAL_SEED"], os.environ["PL_SEED_WORKERS"]) == ("2020", "0")


def test_fabric_lite_variables_are_read_aliases(no_seed, monkeypatch):
    monkeypatch.setenv("FABRIC_LITE_GLOBAL_SEED", "31")
    monkeypatch.setenv("FABRIC_LITE_SEED_WORKERS", "1")
    assert global_seed() == 31 and seed_workers_requested()
    assert seed_everything() == 31
    monkeypatch.setenv("PL_GLOBAL_SEED", "32")  # Lightning's name wins
    assert seed_everything() == 32 and global_seed() == 32
    assert os.environ["FABRIC_LITE_GLOBAL_SEED"] == "31"  # read, never written


@pytest.mark.parametrize("variable", ["PL_GLOBAL_SEED", "FABRIC_LITE_GLOBAL_SEED"])
def test_an_invalid_seed_variable_raises_naming_it(no_seed, monkeypatch, variable):
    monkeypatch.setenv(variable, "invalid")
    with pytest.raises(ValueError, match=f"Invalid seed specified via {variable}: 'invalid'"):
        seed_everything()
    with pytest.raises(ValueError, match=f"Invalid seed specified via {variable}"):
        reset_seed()


@pytest.mark.parametrize("seed", [-1, 2**32, 10e9])
def test_out_of_bounds_seed_raises(no_seed, seed):
    with pytest.raises(ValueError, match=f"{int(seed)} is not in bounds, NumPy accepts 0 to 4294967295"):
        seed_everything(seed)


def test_reset_seed_reads_the_variables_a_parent_set(no_seed, monkeypatch):
    monkeypatch.setenv("PL_GLOBAL_SEED", "11")
    monkeypatch.setenv("PL_SEED_WORKERS", "1")
    reset_seed()
    first = _draw()
    assert os.environ["PL_SEED_WORKERS"] == "1"
    seed_everything(11)
    assert _draw() == first


def test_the_environment_is_restored_between_tests():
    # conftest's _restore_environment undoes what the tests above wrote, whatever the order they ran in
    assert (os.environ.get(ENV_SEED), os.environ.get(ENV_SEED_WORKERS)) == _ENV_AT_IMPORT


def test_none_reads_the_environment_variable(no_seed, monkeypatch):
    monkeypatch.setenv(ENV_SEED, "77")
    assert seed_everything() == 77
    first = _draw()
    seed_everything(77)
    assert _draw() == first


def test_none_without_the_environment_variable_uses_zero(no_seed):
    assert seed_everything(None) == 0
    assert os.environ[ENV_SEED] == "0"
    first = _draw()
    seed_everything(0)
    assert _draw() == first


@pytest.mark.parametrize("seed", [0, 2**32 - 1])
def test_bounds_are_accepted(no_seed, seed):
    assert seed_everything(seed) == seed


def test_numeric_strings_and_numpy_integers(no_seed):
    assert seed_everything("12") == 12
    assert seed_everything(np.int64(13)) == 13
    assert type(seed_everything(np.uint32(14))) is int


def test_fabric_seed_everything_defaults_to_seeding_workers(no_seed):
    assert Fabric.seed_everything(3) == 3
    assert os.environ[ENV_SEED_WORKERS] == "1"
    Fabric.seed_everything(3, workers=False)
    assert os.environ[ENV_SEED_WORKERS] == "0"
    seed_everything(3)  # the plain function does not seed workers unless asked, as in Lightning
    assert os.environ[ENV_SEED_WORKERS] == "0"
    fabric = Fabric(accelerator="cpu", devices=1)
    assert fabric.seed_everything(4) == 4 and os.environ[ENV_SEED_WORKERS] == "1"


def test_verbose_logs_the_seed(no_seed, caplog):
    with caplog.at_level("INFO", logger="fabric_lite.utilities.seed"):
        seed_everything(21)
        seed_everything(22, verbose=False)
    assert [r.getMessage() for r in caplog.records] == ["Seed set to 21"]


# ---------------------------------------------------------------------------------------------- workers
def _worker_streams(base_seed: int, rank: int, worker_id: int):
    """What a dataloader worker draws: torch seeds it with base + worker_id before worker_init_fn runs."""
    torch.manual_seed(base_seed + worker_id)
    worker_init_function(worker_id, rank=rank)
    return _draw()


def test_worker_init_function_differs_per_rank_and_worker():
    streams = {
        (rank, worker): _worker_streams(1000, rank, worker) for rank, worker in itertools.product(range(3), range(3))
    }
    for library in range(3):  # torch, random, numpy: every (rank, worker) pair has its own stream
        values = [repr(s[library]) for s in streams.values()]
        assert len(set(values)) == len(values), library
    # the same on a rerun
    again = {key: _worker_streams(1000, *key) for key in streams}
    assert again == streams
    # and a different base seed (another epoch, another run seed) gives other streams
    assert _worker_streams(2000, 0, 0) != streams[(0, 0)]


class _Draws(Dataset):
    def __len__(self):
        return 4

    def __getitem__(self, index):
        return torch.tensor([torch.rand(1).item(), random.random(), float(np.random.rand())])


def _worker_draws(rank: int):
    loader = DataLoader(
        _Draws(),
        batch_size=1,
        num_workers=2,
        generator=torch.Generator().manual_seed(0),
        worker_init_fn=functools.partial(worker_init_function, rank=rank),
        multiprocessing_context="fork",
    )
    return [batch[0].tolist() for batch in loader]  # items 0, 2 from worker 0; items 1, 3 from worker 1


@pytest.mark.timeout(60)
def test_real_workers_get_distinct_reproducible_streams(no_seed):
    rank0 = _worker_draws(0)
    rank1 = _worker_draws(1)
    assert _worker_draws(0) == rank0  # reproducible
    worker0, worker1 = rank0[0::2], rank0[1::2]
    assert worker0 != worker1
    for column in range(3):
        assert rank0[0][column] != rank1[0][column]  # same worker id, other rank: another stream
