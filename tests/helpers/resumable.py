"""A ``DataLoader`` with a ``state_dict`` of its own, as the loaders real clients use have (torchdata's
``StatefulDataLoader``, litdata's ``StreamingDataLoader`` in litgpt): the epoch and the batches handed out in it.
Resumed, it skips those batches, so a job continues mid-epoch. Each epoch reseeds its generator with
``seed + epoch`` (when it has one) and calls ``set_epoch`` on its sampler (a ``DistributedSampler``), so that the
order survives a resume. Used by tests/helpers/litgpt/tiny.py and tests/helpers/scripts/checkpoint_interchange.py, which
run with either library.
"""

from __future__ import annotations

from typing import Any

from torch.utils.data import DataLoader


class ResumableLoader(DataLoader):  # type: ignore[type-arg]
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.epoch = 0
        self.yielded = 0
        self._skip = 0
        self._seed = self.generator.initial_seed() if self.generator is not None else 0

    def __iter__(self) -> Any:
        if self.generator is not None:
            self.generator.manual_seed(self._seed + self.epoch)
        if hasattr(self.sampler, "set_epoch"):
            self.sampler.set_epoch(self.epoch)
        skip, self._skip = self._skip, 0
        self.yielded = skip
        for index, batch in enumerate(super().__iter__()):
            if index >= skip:
                self.yielded += 1
                yield batch
        self.epoch += 1
        self.yielded = 0

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "batches_yielded": self.yielded}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch = int(state["epoch"])
        self._skip = int(state["batches_yielded"])
