"""Launchers: how a strategy's processes are started."""

from fabric_lite.strategies.launchers.launcher import Launcher
from fabric_lite.strategies.launchers.multiprocessing import MultiProcessingLauncher
from fabric_lite.strategies.launchers.subprocess_script import SubprocessScriptLauncher

__all__ = ["Launcher", "MultiProcessingLauncher", "SubprocessScriptLauncher"]
