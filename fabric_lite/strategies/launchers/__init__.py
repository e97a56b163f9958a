"""Launchers: how a strategy's processes are started."""

from fabric_lite.strategies.launchers.launcher import Launcher
from fabric_lite.strategies.launchers.multiprocessing import MultiProcessingLauncher
from fabric_lite.strategies.launchers.subprocess_script import SubprocessScriptLauncher
from fabric_lite.utilities._lazy import lazy_getattr

__all__ = ["Launcher", "MultiProcessingLauncher", "SubprocessScriptLauncher"]

#: a module of the package as an attribute on first use (``strategies.launchers.xla``), as in Lightning
__getattr__ = lazy_getattr(__name__, {})
