"""Lightning Fabric's ``XLAEnvironment``: importable, never detected (see :mod:`fabric_lite.accelerators.xla`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fabric_lite.accelerators.xla import _XLA_AVAILABLE as _XLA_AVAILABLE  # Lightning's names here (tests patch them)
from fabric_lite.accelerators.xla import _XLA_GREATER_EQUAL_2_1 as _XLA_GREATER_EQUAL_2_1
from fabric_lite.accelerators.xla import _NeedsXLA
from fabric_lite.plugins.environments.cluster_environment import ClusterEnvironment


class XLAEnvironment(_NeedsXLA, ClusterEnvironment):
    """The environment of an XLA (TPU) job, which fabric_lite does not run: never detected, and building one raises.

    Example::

        XLAEnvironment()  # ModuleNotFoundError: XLAEnvironment needs torch_xla and an XLA device ...
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        """Lightning's signature; building one raises (``__new__``)."""

    @staticmethod
    def detect(env: Mapping[str, str] | None = None) -> bool:
        return False


__all__ = ["XLAEnvironment"]
