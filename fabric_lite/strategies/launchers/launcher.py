"""The launcher interface and what every launched child process does first."""

from __future__ import annotations

import os
import signal
import sys
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any

# set by fabric_lite's launchers in the environment of the processes they start
ENV_PARENT_PID = "FABRIC_LITE_PARENT_PID"
ENV_ERROR_DIR = "FABRIC_LITE_ERROR_DIR"
_PR_SET_PDEATHSIG = 1


class Launcher(ABC):
    """Starts the processes a strategy needs and runs a function in them."""

    @abstractmethod
    def launch(self, function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Start the processes (if any) and run ``function(*args, **kwargs)``; return its result (see subclasses)."""

    @property
    def is_interactive_compatible(self) -> bool:
        """Whether it works in a notebook or REPL."""
        return False


def die_with_parent(parent_pid: int) -> None:
    """Make the kernel kill this process when its parent dies, so a SIGKILL to the launcher leaves no orphan.

    Linux only (``prctl(PR_SET_PDEATHSIG)``); elsewhere a no-op. If the parent is already gone, exit now.
    """
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent_pid:
        os._exit(1)


# Run by every child of the script launcher before the user's script: arm the parent-death signal, then exec the
# real command line. `python -c CODE cmd...` sees sys.argv == ["-c", *cmd].
CHILD_SHIM = (
    "import os, sys\n"
    "if sys.platform.startswith('linux'):\n"
    "    import ctypes, signal\n"
    f"    ctypes.CDLL(None, use_errno=True).prctl({_PR_SET_PDEATHSIG}, signal.SIGKILL)\n"
    f"    if os.getppid() != int(os.environ['{ENV_PARENT_PID}']):\n"
    "        os._exit(1)\n"
    "os.execv(sys.argv[1], sys.argv[1:])\n"
)
