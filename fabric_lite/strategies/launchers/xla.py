"""Lightning Fabric's ``_XLALauncher``: importable, an error when built (see :mod:`fabric_lite.accelerators.xla`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NoReturn

from fabric_lite.accelerators.xla import _XLA_AVAILABLE as _XLA_AVAILABLE  # Lightning's name here (tests patch it)
from fabric_lite.accelerators.xla import _NeedsXLA, _xla_missing
from fabric_lite.strategies.launchers.launcher import Launcher


class _XLALauncher(_NeedsXLA, Launcher):
    """Starts one process per XLA device; fabric_lite has no XLA strategy to launch."""

    def __init__(self, strategy: Any) -> None:
        """Lightning's signature; building one raises (``__new__``)."""

    def launch(self, function: Callable[..., Any], *args: Any, **kwargs: Any) -> NoReturn:
        _xla_missing("_XLALauncher.launch")
