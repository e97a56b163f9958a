"""``setup_dataloaders`` on two ranks: the sampler each kind of loader gets, and what every rank iterates.

One ``ddp_fork`` job (``observe``, at the end of this module) observes every case; the tests check them: a random
sampler becomes a shuffling ``DistributedSampler`` whose shards are disjoint, cover the data and reshuffle each epoch;
a sequential one stays ordered; the loader's generator seeds the sampler; worker settings are kept and seeded per
rank; custom samplers and batch samplers are wrapped or made again, or refused with the fix; an iterable dataset, an
existing ``DistributedSampler`` and ``use_distributed_sampler=False`` leave the loader alone.

The checks that start no process are in tests/unit/test_dataloaders.py.
"""

from __future__ import annotations

import functools
import traceback
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch.utils.data import (
    DataLoader,
    DistributedSampler,
    SequentialSampler,
)

from tests.helpers.harness import per_rank
from tests.unit.test_dataloaders import EveryOtherBatchSampler, PairBatchSampler, ReversedSampler, Stream, collate


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


N = 20  # dataset size: even, so the two ranks' shards neither pad nor overlap


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
