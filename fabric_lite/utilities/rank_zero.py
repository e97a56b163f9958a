"""Run functions, log and warn on global rank 0 only (Lightning Fabric's ``utilities.rank_zero``).

``rank_zero_only.rank`` is read from the environment at import (``RANK``, ``LOCAL_RANK``, ``SLURM_PROCID``,
``JSM_NAMESPACE_RANK``, else 0), as in Lightning, and set by the strategies once they know the rank.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable
from functools import wraps
from typing import Any, TypeVar, overload

from typing_extensions import ParamSpec

from fabric_lite._log import get_logger

log = get_logger(__name__)

T = TypeVar("T")
P = ParamSpec("P")

#: the environment variables Lightning reads the global rank from at import, in order; ``LOCAL_RANK`` comes before
#: ``SLURM_PROCID`` because SLURM sets the latter even when it does not start the processes
_RANK_VARIABLES = ("RANK", "LOCAL_RANK", "SLURM_PROCID", "JSM_NAMESPACE_RANK")


def _get_rank() -> int | None:
    """The global rank the environment announces, or ``None``."""
    for name in _RANK_VARIABLES:
        value = os.environ.get(name)
        if value is not None:
            try:
                return int(value)
            except ValueError:
                # Lightning raises at import here; an unreadable variable must not make ``import fabric_lite`` fail
                continue
    return None


@overload
def rank_zero_only(fn: Callable[P, T]) -> Callable[P, T | None]: ...


@overload
def rank_zero_only(fn: Callable[P, T], default: T) -> Callable[P, T]: ...


def rank_zero_only(fn: Callable[P, T], default: T | None = None) -> Callable[P, T | None]:
    """Wrap ``fn`` to run on global rank 0 only and return ``default`` on the other ranks.

    The rank is read at each call, so functions decorated at import follow the rank ``fabric.launch()`` sets later.

    Raises:
        RuntimeError: at call time, when ``rank_zero_only.rank`` is ``None``.

    Example::

        @rank_zero_only
        def save_plot(path): ...  # runs on rank 0, returns None elsewhere
    """

    @wraps(fn)
    def wrapped_fn(*args: P.args, **kwargs: P.kwargs) -> T | None:
        rank = getattr(rank_zero_only, "rank", None)
        if rank is None:
            raise RuntimeError(
                f"{getattr(fn, '__qualname__', fn)!s} is decorated with rank_zero_only, but rank_zero_only.rank is"
                " None. Set it to this process's global rank first (fabric.launch() does)."
            )
        return fn(*args, **kwargs) if rank == 0 else default

    return wrapped_fn


# keep a rank set earlier (e.g. by a module reloaded in the same process) instead of resetting it
rank_zero_only.rank = getattr(rank_zero_only, "rank", _get_rank() or 0)  # type: ignore[attr-defined]


class LightningDeprecationWarning(DeprecationWarning):
    """The category of :func:`rank_zero_deprecation`'s warnings (Lightning's class name).

    Example::

        warnings.simplefilter("error", LightningDeprecationWarning)
    """


# ``stacklevel`` counts frames as in Lightning, whose functions call through one more helper than these: hence the
# ``- 1`` below, so that the same ``stacklevel`` points at the same caller.


@rank_zero_only
def rank_zero_debug(*args: Any, stacklevel: int = 4, **kwargs: Any) -> None:
    """Log at DEBUG level (logger ``fabric_lite.utilities.rank_zero``) on global rank 0 only.

    Example::

        rank_zero_debug("batch %d took %.2f s", i, seconds)
    """
    log.debug(*args, stacklevel=stacklevel - 1, **kwargs)


@rank_zero_only
def rank_zero_info(*args: Any, stacklevel: int = 4, **kwargs: Any) -> None:
    """Log at INFO level (logger ``fabric_lite.utilities.rank_zero``) on global rank 0 only.

    Example::

        rank_zero_info("epoch %d: loss %.3f", epoch, loss)
    """
    log.info(*args, stacklevel=stacklevel - 1, **kwargs)


@rank_zero_only
def rank_zero_warn(message: str | Warning, stacklevel: int = 4, **kwargs: Any) -> None:
    """``warnings.warn(message, **kwargs)`` on global rank 0 only.

    Example::

        rank_zero_warn("the dataloader has no __len__", category=UserWarning)
    """
    warnings.warn(message, stacklevel=stacklevel - 1, **kwargs)


def rank_zero_deprecation(message: str | Warning, stacklevel: int = 5, **kwargs: Any) -> None:
    """A deprecation warning (default category :class:`LightningDeprecationWarning`) on global rank 0 only.

    Example::

        rank_zero_deprecation("`old_arg` is deprecated, use `new_arg`")
    """
    category = kwargs.pop("category", LightningDeprecationWarning)
    rank_zero_warn(message, stacklevel=stacklevel, category=category, **kwargs)


def rank_prefixed_message(message: str, rank: int | None) -> str:
    """``"[rank: {rank}] {message}"``, or ``message`` when ``rank`` is ``None``.

    Example::

        >>> rank_prefixed_message("Seed set to 42", 1)
        '[rank: 1] Seed set to 42'
    """
    return f"[rank: {rank}] {message}" if rank is not None else message


class WarningCache(set[str]):
    """The messages already emitted: each is warned, logged or deprecated once (on rank 0).

    Example::

        cache = WarningCache()
        cache.warn("the batch has no labels")  # shown the first time only
    """

    def warn(self, message: str, stacklevel: int = 5, **kwargs: Any) -> None:
        """:func:`rank_zero_warn` the first time ``message`` is seen."""
        if message not in self:
            self.add(message)
            rank_zero_warn(message, stacklevel=stacklevel, **kwargs)

    def deprecation(self, message: str, stacklevel: int = 6, **kwargs: Any) -> None:
        """:func:`rank_zero_deprecation` the first time ``message`` is seen."""
        if message not in self:
            self.add(message)
            rank_zero_deprecation(message, stacklevel=stacklevel, **kwargs)

    def info(self, message: str, stacklevel: int = 5, **kwargs: Any) -> None:
        """:func:`rank_zero_info` the first time ``message`` is seen."""
        if message not in self:
            self.add(message)
            rank_zero_info(message, stacklevel=stacklevel, **kwargs)


__all__ = [
    "LightningDeprecationWarning",
    "WarningCache",
    "rank_prefixed_message",
    "rank_zero_debug",
    "rank_zero_deprecation",
    "rank_zero_info",
    "rank_zero_only",
    "rank_zero_warn",
]
