"""The logger of each fabric_lite module."""

from __future__ import annotations

import logging
import sys


def get_logger(module: str) -> logging.Logger:
    """``logging.getLogger(module)`` for a fabric_lite module; under the import hook (:mod:`fabric_lite.as_lightning`)
    the logger of the Lightning Fabric module of the same path (``lightning.fabric.X`` for ``fabric_lite.X``).

    A program written for Lightning Fabric configures those loggers (a level for ``lightning.fabric``, a handler,
    ``caplog.at_level(..., logger="lightning.fabric...")``), so what fabric_lite logs must go through them there.

    Example::

        log = get_logger(__name__)  # in fabric_lite/plugins/environments/slurm.py
        log.name  # 'fabric_lite.plugins.environments.slurm' ('lightning.fabric.plugins...' under the hook)
    """
    # the hook can be on only where its module was imported (no import from here: as_lightning imports fabric_lite)
    hook = sys.modules.get("fabric_lite.as_lightning")
    if hook is not None and hook.is_installed() and (module == "fabric_lite" or module.startswith("fabric_lite.")):
        module = "lightning.fabric" + module[len("fabric_lite") :]
    return logging.getLogger(module)
