"""Loggers for ``Fabric(loggers=...)``: ``CSVLogger`` (no extra dependency) and ``TensorBoardLogger`` (needs
``tensorboard``), in Lightning's ``root_dir/name/version_N`` layout; ``Logger`` to write your own."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fabric_lite.loggers.logger import Logger
from fabric_lite.utilities._lazy import lazy_getattr

if TYPE_CHECKING:
    from fabric_lite.loggers.csv_logs import CSVLogger
    from fabric_lite.loggers.tensorboard import TensorBoardLogger

__all__ = ["CSVLogger", "Logger", "TensorBoardLogger"]

# imported on first use, so that `import fabric_lite` stays fast
__getattr__ = lazy_getattr(
    __name__,
    {"CSVLogger": "fabric_lite.loggers.csv_logs", "TensorBoardLogger": "fabric_lite.loggers.tensorboard"},
)
