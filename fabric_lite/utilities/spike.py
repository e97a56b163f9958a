"""Stop training when the loss spikes, and record which batches to skip on resume (Lightning Fabric's
``utilities.spike``)."""

from __future__ import annotations

import json
import os
from collections import deque
from typing import TYPE_CHECKING, Any, Literal

import torch

from fabric_lite.utilities.types import _PATH

if TYPE_CHECKING:
    from fabric_lite.fabric import Fabric


class TrainingSpikeException(RuntimeError):
    """Raised on every rank by :class:`SpikeDetection` when any rank saw a loss spike in batch ``batch_idx``.

    Example::

        try:
            train()
        except TrainingSpikeException as err:
            print(err)  # Training spike detected in batch 812
    """

    def __init__(self, batch_idx: int, *args: Any, **kwargs: Any) -> None:
        super().__init__(f"Training spike detected in batch {batch_idx}", *args, **kwargs)


class _RunningMean:
    """The mean of the non-NaN elements of the last ``window`` updates (as Lightning's ``Running(MeanMetric())``); NaN
    while there is nothing to average."""

    def __init__(self, window: int) -> None:
        self.updates: deque[tuple[float, int]] = deque(maxlen=window)

    def update(self, value: torch.Tensor) -> None:
        flat = value.detach().reshape(-1).to(torch.get_default_dtype())
        kept = flat[~torch.isnan(flat)]
        self.updates.append((float(kept.sum()), int(kept.numel())))

    def compute(self) -> float:
        count = sum(n for _, n in self.updates)
        return sum(s for s, _ in self.updates) / count if count else float("nan")


#: the constructor arguments of :class:`SpikeDetection` that its state dict holds as they are
_SETTINGS = ("mode", "warmup", "atol", "rtol")


class SpikeDetection:
    """A Fabric callback that raises :class:`TrainingSpikeException` when the loss jumps away from its running mean.

    Each rank compares its loss with the mean of its own last ``window`` losses, from batch ``warmup`` on. If any rank
    sees a spike, rank 0 writes the current and the previous batch index (either may have done the damage) to
    ``exclude_batches_path`` (a ``.json`` file, or a folder for ``skip_batches.json``; default: the working
    directory) and every rank raises. A spike is a loss that does not improve on the previous one (per ``mode``) and
    differs from the running mean by at least ``atol`` and by at least ``rtol`` times the mean (``None``: unchecked).
    With ``finite_only``, a non-finite loss is a spike; without it, a batch where any rank's loss is non-finite is
    left out of the mean.

    Raises:
        ValueError: an unknown ``mode`` or a ``window`` below 1.

    Example::

        fabric = Fabric(callbacks=[SpikeDetection(mode="min", window=10, warmup=1, rtol=2.0)])
    """

    def __init__(
        self,
        mode: Literal["min", "max"] = "min",
        window: int = 10,
        warmup: int = 1,
        atol: float | None = None,
        rtol: float | None = 2.0,
        exclude_batches_path: _PATH | None = None,
        finite_only: bool = True,
    ) -> None:
        if mode not in ("min", "max"):
            raise ValueError(f"SpikeDetection(mode={mode!r}): invalid mode. Has to be 'min' or 'max'.")
        if window < 1:
            raise ValueError(f"SpikeDetection(window={window}): the window must hold at least 1 value.")
        self.last_val: torch.Tensor | float = 0.0
        self.running_mean = _RunningMean(window)
        self.mode = mode
        self.warmup = warmup
        self.atol = atol
        self.rtol = rtol
        self.bad_batches: list[int] = []
        self.exclude_batches_path = exclude_batches_path
        self.finite_only = finite_only

    @torch.no_grad()
    def on_train_batch_end(self, fabric: Fabric, loss: torch.Tensor, batch: Any, batch_idx: int) -> None:
        """Check ``loss`` for a spike; every rank must call it for every batch.

        Raises:
            TrainingSpikeException: on every rank, when any rank saw a spike.
        """
        if self.exclude_batches_path is None:
            self.exclude_batches_path = os.getcwd()
        if not str(self.exclude_batches_path).endswith(".json"):
            self.exclude_batches_path = os.path.join(self.exclude_batches_path, "skip_batches.json")

        is_spike = bool(batch_idx >= self.warmup and self._is_spike(loss))
        fabric.strategy.barrier()
        # each rank decides on its own losses, but all ranks must stop together
        if fabric.strategy.reduce_boolean_decision(is_spike, all=False):
            self._handle_spike(fabric, batch_idx)
        is_finite_all = self.finite_only or fabric.strategy.reduce_boolean_decision(
            bool(torch.isfinite(loss).all()), all=True
        )
        if is_finite_all:
            self._update_stats(loss)

    def _is_spike(self, loss: torch.Tensor) -> bool:
        running_val = self.running_mean.compute()
        if self.finite_only and not bool(torch.isfinite(loss).all()):
            return True
        if self._is_better(loss - self.last_val):
            return False
        return self._check_atol(loss, running_val) and self._check_rtol(loss, running_val)

    def _handle_spike(self, fabric: Fabric, batch_idx: int) -> None:
        self.bad_batches.extend([batch_idx - 1, batch_idx])
        if fabric.global_rank == 0:
            path = str(self.exclude_batches_path)
            os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
            with open(path, "w") as f:
                json.dump(self.bad_batches, f, indent=4)
        raise TrainingSpikeException(batch_idx=batch_idx)

    def _check_atol(self, value: torch.Tensor, reference: float) -> bool:
        return self.atol is None or bool(abs(value - reference) >= abs(self.atol))

    def _check_rtol(self, value: torch.Tensor, reference: float) -> bool:
        return self.rtol is None or bool(abs(value - reference) >= abs(self.rtol * reference))

    def _is_better(self, diff: torch.Tensor) -> bool:
        return bool((diff <= 0.0).all()) if self.mode == "min" else bool((diff >= 0.0).all())

    def _update_stats(self, value: torch.Tensor) -> None:
        self.running_mean.update(value)
        self.last_val = value

    def state_dict(self) -> dict[str, Any]:
        """The detector's state, to save in a checkpoint and restore with :meth:`load_state_dict`."""
        last = self.last_val.item() if isinstance(self.last_val, torch.Tensor) else self.last_val
        return {
            "last_val": last,
            **{name: getattr(self, name) for name in _SETTINGS},
            "bad_batches": list(self.bad_batches),
            "bad_batches_path": None if self.exclude_batches_path is None else str(self.exclude_batches_path),
            "running": [list(update) for update in self.running_mean.updates],
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore the state from :meth:`state_dict`."""
        self.last_val = state_dict["last_val"]
        for name in _SETTINGS:
            setattr(self, name, state_dict[name])
        self.bad_batches = list(state_dict["bad_batches"])
        self.exclude_batches_path = state_dict["bad_batches_path"]
        self.running_mean.updates.clear()
        self.running_mean.updates.extend((float(s), int(n)) for s, n in state_dict["running"])


__all__ = ["SpikeDetection", "TrainingSpikeException"]
