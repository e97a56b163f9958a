"""``setup_dataloaders`` and the sampler helpers behind it, in this process.

* One device: the loader's sampler is left alone, batches (dicts, tuples) are moved to the device unless
  ``move_to_device=False``, ``set_epoch`` is called on every iteration, and Lightning's ``worker_init_fn`` is added
  only after ``seed_everything(workers=True)``.
* The helpers (``distributed_sampler``, ``replace_sampler``), with explicit ``num_replicas``/``rank`` (a
  ``DistributedSampler`` needs no process group then): the shuffle and seed are kept, shards are disjoint and cover
  the dataset, a custom sampler is wrapped, and a loader is made again with its settings or refused with the fix.

The checks that start processes are in tests/distributed/test_dataloaders.py.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator

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


def test_iterable_dataset_helper():
    from fabric_lite.utilities.data import has_iterable_dataset

    class Stream(IterableDataset):
        def __iter__(self):
            return iter(range(3))

    assert has_iterable_dataset(DataLoader(Stream()))
    assert not has_iterable_dataset(DataLoader([1, 2]))


def collate(batch: list[int]) -> torch.Tensor:
    """A collate_fn of our own, to check that the re-created loader keeps it."""
    return torch.tensor(batch, dtype=torch.int64)


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


class Stream(IterableDataset):  # type: ignore[type-arg]
    def __iter__(self) -> Iterator[int]:
        return iter(range(6))
