"""``setup_dataloaders`` and the sampler helpers behind it.

* One device: the loader's sampler is left alone, batches (dicts, tuples) are moved to the device.
* The helpers (``distributed_sampler``, ``replace_sampler``), in this process with explicit ``num_replicas``/``rank``
  (a ``DistributedSampler`` needs no process group then).
* Two ranks: one ``ddp_fork`` job (``observe``, at the end of this module) observes every case; the tests below
  check them.
"""

from __future__ import annotations

import functools
import traceback
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from torch.utils.data import (
    BatchSampler,
    DataLoader,
    DistributedSampler,
    IterableDataset,
    RandomSampler,
    Sampler,
    SequentialSampler,
)

from fabric_lite import Fabric, seed_everything
from fabric_lite.utilities.data import DistributedSamplerWrapper, distributed_sampler, replace_sampler
from fabric_lite.utilities.exceptions import MisconfigurationException
from fabric_lite.utilities.seed import ENV_SEED, ENV_SEED_WORKERS, pl_worker_init_function
from tests.helpers.harness import per_rank


@pytest.fixture
def no_seed(monkeypatch):
    monkeypatch.delenv(ENV_SEED, raising=False)
    monkeypatch.delenv(ENV_SEED_WORKERS, raising=False)


def _fabric():
    return Fabric(accelerator="cpu", devices=1)


# ---------------------------------------------------------------------------------------------- one device
class Marker:
    """A batch element with a ``.to(device)`` method, so that a move is observable on a CPU-only machine."""

    def __init__(self) -> None:
        self.moved_to: list[torch.device] = []

    def to(self, device):
        self.moved_to.append(torch.device(device))
        return self


def _dict_collate(batch):
    return {"x": torch.tensor(batch, dtype=torch.float32), "marker": Marker()}


def _tuple_collate(batch):
    return torch.tensor(batch), (Marker(), "label")


def test_single_device_leaves_the_sampler_alone(no_seed):
    loader = DataLoader(list(range(10)), batch_size=3, shuffle=True)
    sampler = loader.sampler
    floader = _fabric().setup_dataloaders(loader)
    assert floader.sampler is sampler and isinstance(sampler, RandomSampler)
    assert floader._dataloader is loader
    assert len(floader) == len(loader) == 4
    assert floader.batch_size == 3 and floader.dataset is loader.dataset
    assert sorted(int(i) for batch in floader for i in batch) == list(range(10))


@pytest.mark.parametrize("collate_fn", [_dict_collate, _tuple_collate], ids=["dict", "tuple"])
def test_single_device_moves_batches_to_the_device(no_seed, collate_fn):
    fabric = _fabric()
    floader = fabric.setup_dataloaders(DataLoader(list(range(4)), batch_size=2, collate_fn=collate_fn))
    assert floader.device == fabric.device == torch.device("cpu")
    batches = list(floader)
    assert len(batches) == 2
    for batch in batches:
        if isinstance(batch, dict):
            assert set(batch) == {"x", "marker"} and batch["x"].device.type == "cpu"
            marker = batch["marker"]
        else:
            assert isinstance(batch, tuple) and batch[1][1] == "label"
            marker = batch[1][0]
        assert marker.moved_to == [torch.device("cpu")]


@pytest.mark.parametrize("collate_fn", [_dict_collate, _tuple_collate], ids=["dict", "tuple"])
def test_move_to_device_false_keeps_batches_as_they_are(no_seed, collate_fn):
    floader = _fabric().setup_dataloaders(
        DataLoader(list(range(4)), batch_size=2, collate_fn=collate_fn), move_to_device=False
    )
    assert floader.device is None
    for batch in floader:
        marker = batch["marker"] if isinstance(batch, dict) else batch[1][0]
        assert marker.moved_to == []


def test_several_loaders_come_back_as_a_list(no_seed):
    a, b = DataLoader(list(range(4))), DataLoader(list(range(6)))
    out = _fabric().setup_dataloaders(a, b)
    assert isinstance(out, list) and [x._dataloader for x in out] == [a, b]


def test_set_epoch_is_called_on_every_iteration_on_one_device_too(no_seed):
    sampler = ReversedSampler(4)
    floader = _fabric().setup_dataloaders(DataLoader(list(range(4)), sampler=sampler))
    for _ in range(3):
        assert [int(x) for x in floader] == [3, 2, 1, 0]
    assert sampler.epochs == [0, 1, 2]


def test_worker_init_fn_is_added_only_when_asked(no_seed):
    fabric = _fabric()
    loader = DataLoader(list(range(4)), num_workers=1)
    assert fabric.setup_dataloaders(loader).worker_init_fn is None  # no seed_everything(workers=True) yet
    Fabric.seed_everything(3)  # workers=True by default on Fabric
    loader = DataLoader(list(range(4)), num_workers=1)
    init = fabric.setup_dataloaders(loader).worker_init_fn
    # Lightning's worker_init_fn: the workers draw the numbers they draw under Lightning
    assert isinstance(init, functools.partial) and init.func is pl_worker_init_function and init.keywords == {"rank": 0}

    def mine(worker_id):
        pass

    own = DataLoader(list(range(4)), num_workers=1, worker_init_fn=mine)
    assert fabric.setup_dataloaders(own).worker_init_fn is mine
    seed_everything(3, workers=False)
    assert fabric.setup_dataloaders(DataLoader(list(range(4)), num_workers=1)).worker_init_fn is None


# ---------------------------------------------------------------------------------------------- helpers, in-process
def test_distributed_sampler_keeps_shuffling_and_the_global_seed(no_seed):
    dataset = list(range(10))
    shuffled = distributed_sampler(DataLoader(dataset, shuffle=True), num_replicas=2, rank=1)
    assert type(shuffled) is DistributedSampler
    assert (shuffled.shuffle, shuffled.seed, shuffled.num_replicas, shuffled.rank) == (True, 0, 2, 1)
    ordered = distributed_sampler(DataLoader(dataset), num_replicas=2, rank=0)
    assert type(ordered) is DistributedSampler and ordered.shuffle is False
    assert list(ordered) == [0, 2, 4, 6, 8]
    seed_everything(31)
    assert distributed_sampler(DataLoader(dataset, shuffle=True), num_replicas=2, rank=0).seed == 31


def test_distributed_sampler_prefers_the_loaders_generator_seed(no_seed):
    seed_everything(31)
    generator = torch.Generator().manual_seed(99)
    sampler = distributed_sampler(DataLoader(list(range(10)), shuffle=True, generator=generator), 2, 0)
    assert sampler.seed == 99
    sampler_generator = torch.Generator().manual_seed(7)
    loader = DataLoader(list(range(10)), sampler=RandomSampler(range(10), generator=sampler_generator))
    assert distributed_sampler(loader, 2, 0).seed == 7


@pytest.mark.parametrize("num_replicas", [2, 3])
def test_shards_are_disjoint_and_cover_the_dataset(no_seed, num_replicas):
    dataset = list(range(12))
    loader = DataLoader(dataset, shuffle=True)
    shards = [list(distributed_sampler(loader, num_replicas, rank)) for rank in range(num_replicas)]
    assert sorted(i for shard in shards for i in shard) == dataset
    assert all(len(shard) == 12 // num_replicas for shard in shards)
    # the same on every call for a given epoch (every rank computes its shard independently)
    assert shards == [list(distributed_sampler(loader, num_replicas, rank)) for rank in range(num_replicas)]


def test_distributed_sampler_wraps_a_custom_sampler(no_seed):
    inner = ReversedSampler(10)
    loader = DataLoader(list(range(10)), sampler=inner)
    wrappers = [distributed_sampler(loader, 2, rank) for rank in range(2)]
    assert all(type(w) is DistributedSamplerWrapper for w in wrappers)
    assert [list(w) for w in wrappers] == [[9, 7, 5, 3, 1], [8, 6, 4, 2, 0]]
    assert len(wrappers[0]) == 5
    wrappers[0].set_epoch(4)
    assert inner.epochs == [4] and wrappers[0].epoch == 4


def test_distributed_sampler_wrapper_draws_afresh_each_iteration(no_seed):
    class EpochShuffle(Sampler[int]):
        def __init__(self) -> None:
            self.epoch = 0

        def __iter__(self):
            g = torch.Generator().manual_seed(self.epoch)
            return iter(torch.randperm(8, generator=g).tolist())

        def __len__(self):
            return 8

        def set_epoch(self, epoch):
            self.epoch = epoch

    inner = EpochShuffle()
    # shuffle=False: the positions are taken in order (DistributedSampler, and so Lightning's wrapper, shuffles them
    # by default), so the expected shares are plain slices of the inner sampler's order
    wrapper = DistributedSamplerWrapper(inner, num_replicas=2, rank=0, shuffle=False)
    first = list(wrapper)
    wrapper.set_epoch(1)
    second = list(wrapper)
    assert first == torch.randperm(8, generator=torch.Generator().manual_seed(0)).tolist()[0::2]
    assert second == torch.randperm(8, generator=torch.Generator().manual_seed(1)).tolist()[0::2]


def test_a_sampler_without_len_cannot_be_split(no_seed):
    class NoLen(Sampler[int]):
        def __iter__(self):
            return iter([1, 2])

    with pytest.raises(TypeError, match=r"NoLen has no __len__.*use_distributed_sampler=False"):
        distributed_sampler(DataLoader(list(range(4)), sampler=NoLen()), 2, 0)


def test_replace_sampler_keeps_the_loader_settings():
    def init(worker_id):
        pass

    generator = torch.Generator().manual_seed(5)
    loader = DataLoader(
        list(range(10)),
        batch_size=3,
        shuffle=True,
        drop_last=True,
        num_workers=2,
        collate_fn=collate,
        pin_memory=False,
        timeout=7,
        worker_init_fn=init,
        generator=generator,
        prefetch_factor=4,
        persistent_workers=True,
    )
    original_sampler = loader.sampler
    sampler = DistributedSampler(loader.dataset, num_replicas=2, rank=0, shuffle=False)
    new = replace_sampler(loader, sampler)
    assert new is not loader and type(new) is DataLoader
    assert new.sampler is sampler and new.batch_sampler.sampler is sampler
    assert (new.batch_size, new.drop_last, new.num_workers, new.timeout) == (3, True, 2, 7)
    assert new.collate_fn is collate and new.worker_init_fn is init and new.generator is generator
    assert (new.prefetch_factor, new.persistent_workers) == (4, True)
    assert new.dataset is loader.dataset
    assert loader.sampler is original_sampler  # the user's loader is untouched


def test_replace_sampler_without_automatic_batching():
    loader = DataLoader(list(range(6)), batch_size=None)
    new = replace_sampler(loader, DistributedSampler(loader.dataset, num_replicas=2, rank=1, shuffle=False))
    assert new.batch_size is None and [int(x) for x in new] == [1, 3, 5]


def test_replace_sampler_recreates_a_compatible_subclass():
    class Tagged(DataLoader):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.tag = "mine"

    loader = Tagged(list(range(4)), batch_size=2)
    new = replace_sampler(loader, SequentialSampler(loader.dataset))
    assert type(new) is Tagged and new.tag == "mine" and new.batch_size == 2


def test_replace_sampler_with_an_incompatible_subclass_says_what_to_do():
    class Custom(DataLoader):
        def __init__(self, data, size):
            super().__init__(data, batch_size=size)

    # Lightning's class and wording; the message names the arguments and both ways out
    with pytest.raises(MisconfigurationException, match=r"`Custom`.*\['data', 'size'\].*use_distributed_sampler=False"):
        replace_sampler(Custom(list(range(4)), 2), SequentialSampler(range(4)))


def test_replace_sampler_makes_a_custom_batch_sampler_again_around_the_sampler():
    dataset = list(range(8))
    loader = DataLoader(dataset, batch_sampler=PairBatchSampler(SequentialSampler(dataset), 2, False))
    sampler = DistributedSampler(dataset, num_replicas=2, rank=1, shuffle=False)
    new = replace_sampler(loader, sampler)
    assert type(new.batch_sampler) is PairBatchSampler and new.batch_sampler.sampler is sampler
    assert (new.batch_sampler.batch_size, new.batch_sampler.drop_last) == (2, False)
    assert [batch.tolist() for batch in new] == [[1, 3], [5, 7]]
    assert loader.batch_sampler.sampler is not sampler  # the user's loader is untouched


def test_replace_sampler_refuses_a_batch_sampler_it_cannot_make_again():
    dataset = list(range(8))
    loader = DataLoader(dataset, batch_sampler=EveryOtherBatchSampler(8))
    with pytest.raises(TypeError) as info:
        replace_sampler(loader, DistributedSampler(dataset, num_replicas=2, rank=0))
    message = str(info.value)
    assert "EveryOtherBatchSampler" in message and "use_distributed_sampler=False" in message
    assert "can't inject a (distributed) sampler into your batch sampler" in message  # Lightning's wording


def test_replace_sampler_keeps_batching_of_an_explicit_standard_batch_sampler():
    dataset = list(range(8))
    plain = DataLoader(dataset, batch_sampler=BatchSampler(SequentialSampler(dataset), 3, True))
    sampler = DistributedSampler(dataset, num_replicas=2, rank=0, shuffle=False)
    new = replace_sampler(plain, sampler)  # the standard BatchSampler is not custom: no TypeError
    assert (new.batch_size, new.drop_last) == (3, True)
    assert [batch.tolist() for batch in new] == [[0, 2, 4]]


# ---------------------------------------------------------------------------------------------- two ranks
@pytest.fixture(scope="module")
def two_ranks():
    from tests.helpers.harness import spawn_job

    return spawn_job("tests.distributed.test_dataloaders:observe", 2, timeout=90)


def _both(two_ranks, check):
    return per_rank(two_ranks, check)


@pytest.mark.distributed
def test_ranks(two_ranks):
    assert [(r["rank"], r["world_size"]) for r in two_ranks] == [(0, 2), (1, 2)]


@pytest.mark.distributed
def test_random_sampler_becomes_a_shuffling_distributed_sampler(two_ranks):
    for rank, r in enumerate(_both(two_ranks, "random")):
        assert r["sampler"] == "DistributedSampler" and r["loader_is_new"]
        assert (r["shuffle"], r["seed"], r["num_replicas"], r["rank"]) == (True, 1234, 2, rank)
        assert (r["batch_size"], r["drop_last"], r["collate_is_ours"]) == (3, True, True)
        assert r["original_sampler_kept"] == "RandomSampler"  # the user's loader is untouched
        assert r["len"] == 3 and r["batch_lengths"] == [3, 3, 3]  # 10 per rank, drop_last drops 1


@pytest.mark.distributed
def test_shards_are_disjoint_cover_the_data_and_reshuffle_each_epoch(two_ranks):
    r0, r1 = _both(two_ranks, "random")
    for epoch in range(3):
        a, b = r0["shards"][epoch], r1["shards"][epoch]
        assert not set(a) & set(b)
        assert sorted(a + b) == list(range(N))
        # what was iterated is the shard, in order, minus the batch dropped by drop_last
        assert r0["epochs"][epoch] == a[:9] and r1["epochs"][epoch] == b[:9]
    assert r0["shards"][0] != r0["shards"][1] != r0["shards"][2]


@pytest.mark.distributed
def test_set_epoch_is_called_with_the_iteration_count(two_ranks):
    for r in _both(two_ranks, "random"):
        assert r["set_epoch_calls"] == [0, 1, 2]


@pytest.mark.distributed
def test_sequential_sampler_stays_ordered(two_ranks):
    for rank, r in enumerate(_both(two_ranks, "sequential")):
        assert (r["sampler"], r["shuffle"], r["seed"], r["rank"], r["batch_size"]) == (
            "DistributedSampler",
            False,
            1234,
            rank,
            4,
        )
        assert r["epochs"] == [list(range(rank, N, 2))] * 2


@pytest.mark.distributed
def test_loader_generator_seeds_the_sampler(two_ranks):
    r0, r1 = _both(two_ranks, "generator")
    for r in (r0, r1):
        assert (r["sampler"], r["shuffle"], r["seed"], r["generator_kept"]) == ("DistributedSampler", True, 99, True)
    for epoch in range(2):
        assert sorted(r0["epochs"][epoch] + r1["epochs"][epoch]) == list(range(N))


@pytest.mark.distributed
def test_workers_settings_kept_and_seeded_per_rank(two_ranks):
    for rank, r in enumerate(_both(two_ranks, "workers")):
        assert (r["num_workers"], r["persistent_workers"], r["collate_is_ours"]) == (2, True, True)
        assert (r["worker_init"], r["worker_init_rank"]) == ("pl_worker_init_function", rank)
        assert r["user_worker_init_kept"] and r["own_num_workers"] == 1


@pytest.mark.distributed
def test_custom_sampler_is_wrapped_and_sharded(two_ranks):
    r0, r1 = _both(two_ranks, "custom_sampler")
    for rank, r in enumerate((r0, r1)):
        assert (r["sampler"], r["rank"], r["inner_is_ours"]) == ("DistributedSamplerWrapper", rank, True)
        assert r["inner_epochs"] == [0, 1]  # set_epoch reaches the user's sampler
    reversed_order = list(range(N - 1, -1, -1))
    assert r0["epochs"] == [reversed_order[0::2]] * 2
    assert r1["epochs"] == [reversed_order[1::2]] * 2


@pytest.mark.distributed
def test_custom_batch_sampler_is_made_again_around_the_distributed_sampler(two_ranks):
    for rank, r in enumerate(_both(two_ranks, "batch_sampler")):
        assert (r["batch_sampler"], r["inner_sampler"]) == ("PairBatchSampler", "DistributedSampler")
        shard = list(range(rank, N, 2))
        assert r["batches"] == [shard[i : i + 2] for i in range(0, len(shard), 2)]


@pytest.mark.distributed
def test_batch_sampler_that_cannot_be_made_again_raises_with_the_fix(two_ranks):
    for r in _both(two_ranks, "batch_sampler"):
        assert r["error"] is not None, "a batch sampler that cannot take a sampler was silently accepted"
        assert "EveryOtherBatchSampler" in r["error"] and "use_distributed_sampler=False" in r["error"]
        assert r["kept_batch_sampler"] == "EveryOtherBatchSampler"
        assert r["kept_epochs"] == [list(range(N))]


@pytest.mark.distributed
def test_use_distributed_sampler_false_keeps_the_sampler(two_ranks):
    for r in _both(two_ranks, "no_distributed_sampler"):
        assert r["sampler_kept"] and r["loader_kept"] and r["sorted_epoch"] == list(range(N))


@pytest.mark.distributed
def test_iterable_dataset_is_left_alone(two_ranks):
    for r in _both(two_ranks, "iterable"):
        assert r["loader_kept"] and r["sampler"] == "_InfiniteConstantSampler"
        assert r["epochs"] == [list(range(6))]


@pytest.mark.distributed
def test_existing_distributed_sampler_is_left_alone(two_ranks):
    r0, r1 = _both(two_ranks, "already_distributed")
    assert r0["loader_kept"] and r1["loader_kept"]
    assert r0["epochs"] == [list(range(1, N, 2))] and r1["epochs"] == [list(range(0, N, 2))]


def test_iterable_dataset_helper():
    from fabric_lite.utilities.data import has_iterable_dataset

    class Stream(IterableDataset):
        def __iter__(self):
            return iter(range(3))

    assert has_iterable_dataset(DataLoader(Stream()))
    assert not has_iterable_dataset(DataLoader([1, 2]))


# ------------------------------------------------- the job: run on every rank by tests/helpers/jobs/_runner.py

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
