"""The logger of each fabric_lite module."""

from __future__ import annotations

import logging
import sys


def get_logger(module: str) -> logging.Logger:
    """``logging.getLogger(module)``; under the import hook (:mod:`fabric_lite.as_lightning`) ``lightning.fabric.X``
    for ``fabric_lite.X``, so that a program's configuration of Lightning's loggers applies."""
    # the hook can be on only where its module was imported (no import from here: as_lightning imports fabric_lite)
    hook = sys.modules.get("fabric_lite.as_lightning")
    if hook is not None and hook.is_installed() and (module == "fabric_lite" or module.startswith("fabric_lite.")):
        module = "lightning.fabric" + module[len("fabric_lite") :]
    return logging.getLogger(module)
