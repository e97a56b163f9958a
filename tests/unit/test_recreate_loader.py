"""Making a loader again around another sampler (``fabric_lite.utilities.data._update_dataloader``, which
``setup_dataloaders`` uses for its ``DistributedSampler``), and the recording context that lets it make any subclass
again (``_replace_dunder_methods``), in one process.

The two-rank behaviour of ``setup_dataloaders`` is in tests/distributed/test_dataloaders.py.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.data import BatchSampler, DataLoader, DistributedSampler, IterableDataset, SequentialSampler

from fabric_lite.utilities.data import (
    _get_dataloader_init_args_and_kwargs,
    _replace_dunder_methods,
    _set_sampler_epoch,
    _update_dataloader,
    _WrapAttrTag,
)
from fabric_lite.utilities.exceptions import MisconfigurationException


def _shard(dataset: Any, rank: int = 0) -> DistributedSampler:  # type: ignore[type-arg]
    return DistributedSampler(dataset, num_replicas=2, rank=rank, shuffle=False)


class Images(DataLoader):  # type: ignore[type-arg]
    """A loader whose own argument (``pixels``) DataLoader does not keep."""

    def __init__(self, pixels: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        self.scale = 2
        super().__init__(list(range(pixels.size(0))), *args, **kwargs)


def test_a_subclass_keeping_its_arguments_as_attributes_is_made_again() -> None:
    class Named(DataLoader):  # type: ignore[type-arg]
        def __init__(self, dataset: Any, tag: str, **kwargs: Any) -> None:
            self.tag = tag
            super().__init__(dataset, **kwargs)

    loader = Named(list(range(8)), "mine", batch_size=2)
    new = _update_dataloader(loader, _shard(loader.dataset, rank=1))
    assert type(new) is Named and new.tag == "mine" and new.batch_size == 2
    assert [b.tolist() for b in new] == [[1, 3], [5, 7]]


def test_a_subclass_with_arguments_it_does_not_keep_names_them() -> None:
    loader = Images(torch.zeros(4, 3), batch_size=2)
    with pytest.raises(MisconfigurationException) as info:
        _update_dataloader(loader, _shard(loader.dataset))
    message = str(info.value)
    assert "Trying to inject custom `Sampler` into the `Images` instance" in message  # Lightning's wording
    assert "The missing attributes are ['pixels']" in message and "`self.pixels`" in message
    assert "use_distributed_sampler=False" in message


def test_recorded_arguments_make_any_subclass_again_with_its_later_attributes() -> None:
    pixels = torch.zeros(6, 3)
    with _replace_dunder_methods(DataLoader, "dataset"):
        loader = Images(pixels, batch_size=3)
        loader.note = "set after __init__"  # type: ignore[attr-defined]
    assert getattr(loader, "__pl_saved_args") == (pixels,) and getattr(loader, "__pl_saved_kwargs") == {"batch_size": 3}
    assert getattr(loader, "__pl_saved_arg_names") == ("pixels",) and getattr(loader, "__dataset") == list(range(6))
    assert getattr(loader, "__pl_attrs_record") == [(("note", "set after __init__"), _WrapAttrTag.SET)]
    new = _update_dataloader(loader, _shard(loader.dataset))
    assert type(new) is Images and new.batch_size == 3 and new.note == "set after __init__"  # type: ignore[attr-defined]
    assert [b.tolist() for b in new] == [[0, 2, 4]]
    assert not hasattr(new, "__pl_saved_args")  # made outside the context: nothing recorded


def test_the_recording_context_puts_every_method_back_also_after_an_error() -> None:
    class Own(DataLoader):  # type: ignore[type-arg]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)

        def __setattr__(self, name: str, value: Any) -> None:
            super().__setattr__(name, value)

    class Inherits(Own):
        pass

    classes = (DataLoader, Own, Inherits, BatchSampler)
    before = {cls: (cls.__init__, cls.__setattr__, cls.__delattr__, dict(vars(cls))) for cls in classes}
    with pytest.raises(RuntimeError, match="boom"), _replace_dunder_methods(DataLoader, "dataset"):
        with _replace_dunder_methods(BatchSampler):
            assert DataLoader.__init__ is not before[DataLoader][0]
            assert "__init__" not in vars(Inherits)  # a subclass without its own __init__ inherits the recording one
        raise RuntimeError("boom")
    assert {cls: (cls.__init__, cls.__setattr__, cls.__delattr__, dict(vars(cls))) for cls in classes} == before


def test_deletions_and_overridden_setattr_are_replayed_as_the_user_called_them() -> None:
    class Doubling(DataLoader):  # type: ignore[type-arg]
        def __setattr__(self, name: str, value: Any) -> None:
            super().__setattr__(name, value * 2 if name == "factor" else value)

    with _replace_dunder_methods(DataLoader, "dataset"):
        loader = Doubling(list(range(4)))
        loader.factor = 5  # type: ignore[attr-defined]
        loader.extra = 1  # type: ignore[attr-defined]
        del loader.extra  # type: ignore[attr-defined]
    assert getattr(loader, "__pl_attrs_record") == [
        (("factor", 5), _WrapAttrTag.SET),
        (("extra", 1), _WrapAttrTag.SET),
        (("extra",), _WrapAttrTag.DEL),
    ]
    new = _update_dataloader(loader, SequentialSampler(loader.dataset))
    assert new.factor == 10 and not hasattr(new, "extra")  # type: ignore[attr-defined]


def test_a_subclass_passing_an_argument_twice_gets_lightnings_error() -> None:
    class Twice(DataLoader):  # type: ignore[type-arg]
        def __init__(self, randomize: bool, *args: Any, **kwargs: Any) -> None:
            self.randomize = randomize
            super().__init__(*args, shuffle=randomize, **kwargs)

    with pytest.raises(MisconfigurationException, match=r"implementation has an error.*`shuffle`.*kwargs.pop"):
        _update_dataloader(Twice(False, []), SequentialSampler([]))


def test_a_custom_batch_sampler_with_recorded_arguments_is_made_again_around_the_sampler() -> None:
    class Tagged(BatchSampler):
        def __init__(self, sampler: Any, tag: str, drop_last: bool = True) -> None:
            self.tag = tag
            super().__init__(sampler, 2, drop_last)

    with _replace_dunder_methods(BatchSampler):
        batch_sampler = Tagged(SequentialSampler(range(8)), "mine")
    loader = DataLoader(list(range(8)), batch_sampler=batch_sampler)
    sampler = _shard(loader.dataset, rank=1)
    new = _update_dataloader(loader, sampler)
    assert type(new.batch_sampler) is Tagged and new.batch_sampler.tag == "mine"
    assert new.batch_sampler.sampler is sampler and [b.tolist() for b in new] == [[1, 3], [5, 7]]


def test_a_recorded_batch_sampler_without_a_sampler_argument_says_so() -> None:
    class Fixed(BatchSampler):
        def __init__(self, tag: str) -> None:
            super().__init__(SequentialSampler(range(4)), 2, False)

    with _replace_dunder_methods(BatchSampler):
        batch_sampler = Fixed("x")
    loader = DataLoader(list(range(4)), batch_sampler=batch_sampler)
    with pytest.raises(TypeError, match=r"sampler into the batch sampler.*Fixed.*`sampler`"):
        _update_dataloader(loader, _shard(loader.dataset))


def test_an_iterable_dataset_gets_no_sampler() -> None:
    class Stream(IterableDataset):  # type: ignore[type-arg]
        def __iter__(self) -> Any:
            return iter(range(4))

    loader = DataLoader(Stream(), batch_size=2)
    _, kwargs = _get_dataloader_init_args_and_kwargs(loader, _shard(range(4)))
    assert kwargs["sampler"] is None and kwargs["batch_sampler"] is None and kwargs["batch_size"] == 2


def test_array_attributes_are_compared_by_identity() -> None:
    class WithArray(DataLoader):  # type: ignore[type-arg]
        def __init__(self, dataset: Any, indices: Any = None, **kwargs: Any) -> None:
            super().__init__(dataset, **kwargs)
            self.indices = np.arange(4)  # `==` with the default would give an array, not one truth value

    loader = WithArray(list(range(4)))
    _, kwargs = _get_dataloader_init_args_and_kwargs(loader, SequentialSampler(range(4)))
    assert kwargs["indices"] is loader.indices


def test_not_a_dataloader_is_refused_with_its_value() -> None:
    with pytest.raises(ValueError, match=r"\[1, 2\].*subclass `torch.utils.data.DataLoader`"):
        _get_dataloader_init_args_and_kwargs([1, 2], SequentialSampler(range(2)))  # type: ignore[arg-type]


class _Epochs:
    def __init__(self) -> None:
        self.epochs: list[int] = []

    def set_epoch(self, epoch: int) -> None:
        self.epochs.append(epoch)

    def __iter__(self) -> Any:
        return iter(range(4))

    def __len__(self) -> int:
        return 4


def test_set_sampler_epoch_reaches_the_sampler_and_the_batch_samplers_sampler_once_each() -> None:
    sampler = _Epochs()
    loader = DataLoader(list(range(4)), sampler=sampler, batch_size=2)  # the batch sampler wraps the same sampler
    _set_sampler_epoch(loader, 3)
    assert sampler.epochs == [3]
    inner = _Epochs()
    loader = DataLoader(list(range(4)), batch_sampler=BatchSampler(inner, 2, False))
    _set_sampler_epoch(loader, 4)
    assert inner.epochs == [4]
    _set_sampler_epoch(object(), 5)  # nothing to call: no error
