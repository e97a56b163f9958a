"""A loader from ``setup_dataloaders`` resumes inside an epoch: after ``load_state_dict`` its next iteration gives the
batches the interrupted epoch had not handed out, in the same order, without reading the others, and every random
generator goes on as in the run that never stopped (issue 25, part 1).

Each case runs one loader twice in one process: once without a stop, and once stopped after ``k`` batches, saved
(through ``torch.save``/``torch.load(weights_only=True)``, as a checkpoint), rebuilt from scratch and resumed.
The model's own draws are stood in for by one ``torch.rand`` per batch.
"""

from __future__ import annotations

import io
import multiprocessing
import pickle
import warnings
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch.utils.data import (
    BatchSampler,
    DataLoader,
    Dataset,
    DistributedSampler,
    IterableDataset,
    RandomSampler,
    SequentialSampler,
)

from fabric_lite.wrappers import _FabricDataLoader

N = 40


class CountingDataset(Dataset):  # type: ignore[type-arg]
    """Records every index it reads, in shared memory, so that reads in worker processes count too."""

    def __init__(self) -> None:
        self.reads = multiprocessing.get_context("fork").Array("i", N, lock=False)

    def __len__(self) -> int:
        return N

    def __getitem__(self, index: int) -> torch.Tensor:
        self.reads[index] += 1
        return torch.tensor([index])

    def read(self) -> set[int]:
        return {i for i in range(N) if self.reads[i]}


def _workers(num_workers: int) -> dict[str, Any]:
    return {"num_workers": num_workers, "multiprocessing_context": "fork"} if num_workers else {}


def sequential(ds: Dataset, w: int) -> DataLoader:  # type: ignore[type-arg]
    return DataLoader(ds, batch_size=4, **_workers(w))


def shuffled(ds: Dataset, w: int) -> DataLoader:  # type: ignore[type-arg]
    return DataLoader(ds, batch_size=4, shuffle=True, **_workers(w))


def shuffled_with_generator(ds: Dataset, w: int) -> DataLoader:  # type: ignore[type-arg]
    return DataLoader(ds, batch_size=4, shuffle=True, generator=torch.Generator().manual_seed(5), **_workers(w))


def random_sampler_with_generator(ds: Dataset, w: int) -> DataLoader:  # type: ignore[type-arg]
    sampler = RandomSampler(ds, generator=torch.Generator().manual_seed(3))  # type: ignore[arg-type]
    return DataLoader(ds, batch_size=4, sampler=sampler, **_workers(w))


def distributed(shuffle: bool, drop_last: bool, rank: int) -> Callable[[Dataset, int], DataLoader]:  # type: ignore[type-arg]
    def make(ds: Dataset, w: int) -> DataLoader:  # type: ignore[type-arg]
        sampler = DistributedSampler(ds, num_replicas=3, rank=rank, shuffle=shuffle, drop_last=drop_last, seed=11)
        return DataLoader(ds, batch_size=3, sampler=sampler, **_workers(w))

    make.__name__ = f"distributed_shuffle{int(shuffle)}_droplast{int(drop_last)}_rank{rank}"
    return make


def batch_sampler(ds: Dataset, w: int) -> DataLoader:  # type: ignore[type-arg]
    return DataLoader(ds, batch_sampler=BatchSampler(RandomSampler(ds), 3, drop_last=True), **_workers(w))  # type: ignore[arg-type]


def no_batching(ds: Dataset, w: int) -> DataLoader:  # type: ignore[type-arg]
    return DataLoader(ds, batch_size=None, sampler=RandomSampler(ds), **_workers(w))  # type: ignore[arg-type]


def sequential_sampler_no_batching(ds: Dataset, w: int) -> DataLoader:  # type: ignore[type-arg]
    return DataLoader(ds, batch_size=None, sampler=SequentialSampler(ds), **_workers(w))  # type: ignore[arg-type]


CASES = [
    (sequential, 0),
    (shuffled, 0),
    (shuffled_with_generator, 0),
    (random_sampler_with_generator, 0),
    *((distributed(s, d, r), 0) for s in (False, True) for d in (False, True) for r in (0, 2)),
    (batch_sampler, 0),
    (no_batching, 0),
    (sequential_sampler_no_batching, 0),
    (shuffled, 2),
    (shuffled_with_generator, 2),
    (random_sampler_with_generator, 2),
    *((distributed(True, d, 1), 2) for d in (False, True)),
    (batch_sampler, 2),
]


def values(batch: torch.Tensor) -> list[int]:
    return batch.flatten().tolist()  # type: ignore[no-any-return]


def checkpoint(state: Any) -> Any:
    """``state`` after a round trip through a file, read as ``fabric.load`` reads it."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


Make = Callable[[Dataset, int], DataLoader]  # type: ignore[type-arg]


def uninterrupted(make: Make, workers: int) -> tuple[list[list[int]], list[list[int]], torch.Tensor]:
    torch.manual_seed(0)
    loader = _FabricDataLoader(make(CountingDataset(), workers))
    epochs = []
    for _ in range(2):
        epochs.append([values(b) for b in loader if torch.rand(1) is not None])
    return epochs[0], epochs[1], torch.get_rng_state()


@pytest.mark.parametrize(("make", "workers"), CASES, ids=[f"{m.__name__}-w{w}" for m, w in CASES])
def test_resume_continues_with_the_next_batch_and_reads_none_before(make: Any, workers: int) -> None:
    first, second, rng_after = uninterrupted(make, workers)
    k = len(first) // 2 + 1

    torch.manual_seed(0)
    loader = _FabricDataLoader(make(CountingDataset(), workers))
    iterator = iter(loader)
    before = []
    for _ in range(k):
        before.append(values(next(iterator)))
        torch.rand(1)
    state = checkpoint(loader.state_dict())
    rng = torch.get_rng_state()
    del iterator, loader

    assert state["epoch"] == 0 and state["batches_yielded"] == k
    torch.manual_seed(999)  # a new process: other generator states until the checkpoint restores them
    dataset = CountingDataset()
    resumed = _FabricDataLoader(make(dataset, workers))
    resumed.load_state_dict(state)
    torch.set_rng_state(rng)  # what RandomState restores
    after = []
    for batch in resumed:
        after.append(values(batch))
        torch.rand(1)
    read_while_resuming = dataset.read()
    assert before + after == first
    assert not read_while_resuming & {i for batch in before for i in batch}, "a skipped batch was read"
    assert [values(b) for b in resumed if torch.rand(1) is not None] == second  # the next epoch's order
    assert torch.equal(torch.get_rng_state(), rng_after)  # the model's draws went on unchanged


def test_a_loader_state_between_epochs_is_the_epoch_as_before() -> None:
    loader = _FabricDataLoader(shuffled(CountingDataset(), 0))
    assert loader.state_dict()["epoch"] == 0
    for _ in loader:
        pass
    state = loader.state_dict()
    assert (state["epoch"], state["batches_yielded"]) == (1, 0) and "rng_at_epoch_start" not in state


def test_an_earlier_epoch_only_state_resumes_at_the_epoch_start() -> None:
    """``{"epoch": n}``, as earlier versions wrote, restores the epoch count: the next epoch's order is epoch n's."""
    make = distributed(True, False, 0)
    reference = _FabricDataLoader(make(CountingDataset(), 0))
    epochs = [[values(b) for b in reference] for _ in range(3)]
    loader = _FabricDataLoader(make(CountingDataset(), 0))
    loader.load_state_dict({"epoch": 2})
    assert [values(b) for b in loader] == epochs[2] != epochs[1]


def test_break_then_save_resumes_mid_epoch() -> None:
    torch.manual_seed(0)
    first, _, _ = uninterrupted(shuffled, 0)
    torch.manual_seed(0)
    loader = _FabricDataLoader(shuffled(CountingDataset(), 0))
    seen = []
    for i, batch in enumerate(loader):
        seen.append(values(batch))
        torch.rand(1)
        if i == 2:
            break
    state = checkpoint(loader.state_dict())
    assert state["batches_yielded"] == 3
    rng = torch.get_rng_state()
    resumed = _FabricDataLoader(shuffled(CountingDataset(), 0))
    resumed.load_state_dict(state)
    torch.set_rng_state(rng)
    assert seen + [values(b) for b in resumed] == first


def test_a_state_saved_after_load_before_iterating_is_the_loaded_one() -> None:
    torch.manual_seed(0)
    loader = _FabricDataLoader(shuffled(CountingDataset(), 0))
    iterator = iter(loader)
    next(iterator)
    next(iterator)
    state = checkpoint(loader.state_dict())
    other = _FabricDataLoader(shuffled(CountingDataset(), 0))
    other.load_state_dict(state)
    again = checkpoint(other.state_dict())
    assert again.keys() == state.keys()
    assert (again["epoch"], again["batches_yielded"]) == (0, 2)
    saved, reloaded = (s["rng_at_epoch_start"]["per_rank"][0]["torch"] for s in (state, again))
    assert torch.equal(saved, reloaded)


def test_a_state_saved_after_the_last_batch_yields_nothing_more_then_goes_on() -> None:
    torch.manual_seed(0)
    loader = _FabricDataLoader(shuffled(CountingDataset(), 0))
    iterator = iter(loader)
    for _ in range(N // 4):
        next(iterator)
    state = checkpoint(loader.state_dict())  # the last batch handed out, the loop has not ended yet
    assert state["batches_yielded"] == N // 4
    resumed = _FabricDataLoader(shuffled(CountingDataset(), 0))
    resumed.load_state_dict(state)
    assert list(resumed) == []
    assert len(list(resumed)) == N // 4 and resumed._num_iter_calls == 2


def test_a_changed_number_of_batches_restarts_the_epoch_with_a_warning() -> None:
    torch.manual_seed(0)
    loader = _FabricDataLoader(shuffled(CountingDataset(), 0))
    iterator = iter(loader)
    next(iterator)
    state = checkpoint(loader.state_dict())
    smaller = _FabricDataLoader(DataLoader(CountingDataset(), batch_size=8, shuffle=True))
    with pytest.warns(UserWarning, match=r"saved with 10 batches on 1 process\(es\), and now has 5 on 1.*restarts"):
        smaller.load_state_dict(state)
    assert smaller._num_iter_calls == 0 and len(list(smaller)) == 5


def test_a_lightning_checkpoint_with_the_pickled_loader_warns_and_starts_over() -> None:
    loader = _FabricDataLoader(shuffled(CountingDataset(), 0))
    with pytest.warns(UserWarning, match="Lightning Fabric saves a plain DataLoader object itself"):
        loader.load_state_dict(DataLoader(CountingDataset()))
    assert loader._num_iter_calls == 0


class Stream(IterableDataset):  # type: ignore[type-arg]
    def __init__(self) -> None:
        self.position = 0

    def __iter__(self) -> Any:
        while self.position < 10:
            self.position += 1
            yield torch.tensor([self.position - 1])
        self.position = 0


class StatefulStream(Stream):
    def state_dict(self) -> dict[str, int]:
        return {"position": self.position}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.position = state["position"]


def test_an_iterable_dataset_with_a_state_resumes_through_it() -> None:
    loader = _FabricDataLoader(DataLoader(StatefulStream(), batch_size=2))
    iterator = iter(loader)
    before = [values(next(iterator)) for _ in range(2)]
    state = checkpoint(loader.state_dict())
    assert state["dataset"] == {"position": 4}
    resumed = _FabricDataLoader(DataLoader(StatefulStream(), batch_size=2))
    resumed.load_state_dict(state)
    assert before + [values(b) for b in resumed] == [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9]]


def test_an_iterable_dataset_without_a_state_says_the_epoch_restarts() -> None:
    loader = _FabricDataLoader(DataLoader(Stream(), batch_size=2))
    iterator = iter(loader)
    next(iterator)
    state = checkpoint(loader.state_dict())
    resumed = _FabricDataLoader(DataLoader(Stream(), batch_size=2))
    with pytest.warns(UserWarning, match="IterableDataset has no state_dict.*StatefulDataLoader"):
        resumed.load_state_dict(state)
    assert len(list(resumed)) == 5


def test_a_loader_that_cannot_be_copied_restarts_the_epoch_with_a_warning() -> None:
    class Uncopyable(DataLoader):  # type: ignore[type-arg]
        def __copy__(self) -> Any:
            raise TypeError("no copies")

    torch.manual_seed(0)
    loader = _FabricDataLoader(Uncopyable(CountingDataset(), batch_size=4, shuffle=True))
    iterator = iter(loader)
    next(iterator)
    state = checkpoint(loader.state_dict())
    resumed = _FabricDataLoader(Uncopyable(CountingDataset(), batch_size=4, shuffle=True))
    resumed.load_state_dict(state)
    with pytest.warns(UserWarning, match="cannot resume inside its epoch \\(no copies\\)"):
        assert len(list(resumed)) == N // 4


def test_torch_internals_the_replay_relies_on() -> None:
    """The replay copies a DataLoader through its ``__dict__`` and expects ``iter()`` to draw the workers' base seed
    before the sampler's first draw: fail loudly on a torch that changes either."""
    assert "__setstate__" not in vars(DataLoader) and "__copy__" not in vars(DataLoader)
    torch.manual_seed(0)
    iter(DataLoader(CountingDataset(), batch_size=4, shuffle=True))
    one_draw = torch.get_rng_state()
    torch.manual_seed(0)
    torch.empty((), dtype=torch.int64).random_()
    assert torch.equal(one_draw, torch.get_rng_state())


def test_the_wrapper_stays_picklable_and_warning_free() -> None:
    loader = _FabricDataLoader(shuffled(CountingDataset(), 0))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        list(loader)
    assert pickle.loads(pickle.dumps(loader.state_dict()))["epoch"] == 1


class Augmented(Dataset):  # type: ignore[type-arg]
    """Adds noise drawn in whichever process reads the sample, as random augmentation does."""

    def __len__(self) -> int:
        return N

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.tensor([float(index)]) + torch.rand(1)


def _augmented_run(wrap: bool, stop_after: int | None) -> list[torch.Tensor]:
    """Two epochs of 2-worker batches; with ``stop_after``, stopped, saved and resumed in a new loader."""
    from fabric_lite.utilities.data import SeedPerSample

    def make() -> _FabricDataLoader:
        dataset = SeedPerSample(Augmented(), seed=3) if wrap else Augmented()
        return _FabricDataLoader(DataLoader(dataset, batch_size=4, shuffle=True, **_workers(2)))

    torch.manual_seed(0)
    loader = make()
    batches: list[torch.Tensor] = []
    if stop_after is not None:
        iterator = iter(loader)
        batches += [next(iterator) for _ in range(stop_after)]
        state, rng = checkpoint(loader.state_dict()), torch.get_rng_state()
        del iterator
        loader = make()
        loader.load_state_dict(state)
        torch.set_rng_state(rng)
    for _ in range(2):
        batches += list(loader)
    return batches


def test_seed_per_sample_makes_worker_side_augmentation_survive_a_resume() -> None:
    def same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
        return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b, strict=True))

    assert same(_augmented_run(True, None), _augmented_run(True, 3))
    assert not same(_augmented_run(False, None), _augmented_run(False, 3))  # the control: workers' own streams
    run = _augmented_run(True, None)
    first_epoch, second_epoch = (torch.cat(half).flatten().sort().values for half in (run[:10], run[10:]))
    assert not torch.equal(first_epoch, second_epoch)  # each epoch draws new numbers for the same samples


def test_seed_per_sample_in_the_main_process_leaves_the_global_generators_alone() -> None:
    import random

    import numpy as np

    from fabric_lite.utilities.data import SeedPerSample

    dataset = SeedPerSample(Augmented(), seed=1)
    torch.manual_seed(0)
    random.seed(0)
    np.random.seed(0)
    expected = (torch.rand(1), random.random(), np.random.rand())
    torch.manual_seed(0)
    random.seed(0)
    np.random.seed(0)
    first = dataset[5]
    assert (torch.rand(1), random.random(), np.random.rand()) == expected
    assert torch.equal(first, dataset[5]) and not torch.equal(first, dataset[6])


def test_seed_per_sample_refuses_persistent_workers() -> None:
    from fabric_lite.utilities.data import SeedPerSample

    loader = DataLoader(SeedPerSample(Augmented()), batch_size=4, num_workers=2, persistent_workers=True)
    with pytest.raises(ValueError, match="persistent_workers=False"):
        _FabricDataLoader(loader)
