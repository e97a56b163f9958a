"""The ``Logger`` base class: what ``fabric.log``/``fabric.log_dict`` need from a logger."""

from __future__ import annotations

import functools
from abc import ABC, abstractmethod
from argparse import Namespace
from collections.abc import Callable
from typing import Any

from torch import Tensor
from torch.nn import Module


class Logger(ABC):
    """Base class for experiment loggers, as in Lightning Fabric.

    A subclass implements :attr:`name`, :attr:`version`, :meth:`log_metrics` and :meth:`log_hyperparams`. A logger
    given to ``Fabric(loggers=...)`` gets ``fabric.log``/``fabric.log_dict`` on global rank 0 only, and
    :meth:`finalize` when the function given to ``fabric.launch`` returns.

    Example::

        class PrintLogger(Logger):
            name, version = "print", 0

            def log_metrics(self, metrics, step=None):
                print(step, metrics)

            def log_hyperparams(self, params, *args, **kwargs):
                print(params)
    """

    @property
    @abstractmethod
    def name(self) -> str | None:
        """The experiment's name."""

    @property
    @abstractmethod
    def version(self) -> int | str | None:
        """The experiment's version."""

    @property
    def root_dir(self) -> str | None:
        """The folder that holds every version of the experiment, or ``None`` for a logger that writes no files."""
        return None

    @property
    def save_dir(self) -> str | None:
        """Same as :attr:`root_dir` (the name Lightning's trainer loggers use)."""
        return self.root_dir

    @property
    def log_dir(self) -> str | None:
        """The folder this version writes into, or ``None`` for a logger that writes no files."""
        return None

    @property
    def group_separator(self) -> str:
        """The separator that groups metric names into sections (``"train/loss"``)."""
        return "/"

    @abstractmethod
    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        """Record scalar metrics at ``step`` (``None``: the logger's own count, if it keeps one)."""

    @abstractmethod
    def log_hyperparams(self, params: dict[str, Any] | Namespace, *args: Any, **kwargs: Any) -> None:
        """Record the hyperparameters of the run (a dict or an ``argparse.Namespace``)."""

    def log_graph(self, model: Module, input_array: Tensor | None = None) -> None:
        """Record the model's graph; a no-op unless the logger supports it."""

    def save(self) -> None:
        """Write what is buffered to its destination."""

    def finalize(self, status: str) -> None:
        """Finish the run, which ended with ``status`` (e.g. ``"success"``): write what is buffered, release files."""
        self.save()


class _DummyExperiment:
    """What ``logger.experiment`` is on ranks other than 0: every method call does nothing."""

    def nop(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __getattr__(self, _: str) -> Callable[..., None]:
        return self.nop

    def __getitem__(self, index: int) -> _DummyExperiment:
        return self  # logger.experiment[0].add_image(...)

    def __setitem__(self, *args: Any, **kwargs: Any) -> None:
        pass


def rank_zero_experiment(fn: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """Decorate a logger's ``experiment`` getter: global rank 0 gets the real experiment, other ranks a
    :class:`_DummyExperiment` whose methods do nothing (as in Lightning Fabric)."""

    @functools.wraps(fn)
    def experiment(self: Any) -> Any:
        from fabric_lite.utilities.rank_zero import rank_zero_only

        return _DummyExperiment() if (getattr(rank_zero_only, "rank", 0) or 0) > 0 else fn(self)

    return experiment
