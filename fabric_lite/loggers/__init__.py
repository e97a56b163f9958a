"""Loggers for ``Fabric(loggers=...)``: ``CSVLogger`` (no extra dependency) and ``TensorBoardLogger`` (needs
``tensorboard``), with Lightning's ``root_dir/name/version_N`` folder layout; ``Logger`` to write your own.

Example::

    from fabric_lite import Fabric
    from fabric_lite.loggers import CSVLogger

    fabric = Fabric(loggers=CSVLogger("logs"))
    fabric.log("loss", 0.25, step=0)  # logs/lightning_logs/version_0/metrics.csv, written by global rank 0
"""

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
