"""The launcher interface and what every launched child process does first."""

from __future__ import annotations

import os
import signal
import sys
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any

import torch.distributed as dist

# set by fabric_lite's launchers in the environment of the processes they start
ENV_PARENT_PID = "FABRIC_LITE_PARENT_PID"
ENV_ERROR_FD = "FABRIC_LITE_ERROR_FD"
_PR_SET_PDEATHSIG = 1

# what an error looks like when it is only the consequence of another rank going away
_SECONDARY_MARKERS = (
    "Connection closed by peer",
    "Connection reset by peer",
    "Broken pipe",
    "Socket Timeout",
    "Timed out waiting",
    "timed out",
    "NCCL communicator was aborted",
    "ProcessGroupNCCL is aborted",
)


class Launcher(ABC):
    """Starts the processes a strategy needs and runs a function in them."""

    #: whether ``fabric.launch()`` needs a function (the processes it starts run only that function)
    requires_function: bool = False

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


def is_secondary(error: BaseException | str) -> bool:
    """Whether an error (or the last line of a traceback) only reports that another rank went away."""
    if isinstance(error, BaseException):
        dist_error = getattr(dist, "DistError", None)
        text = f"{type(error).__name__}: {error}"
        if dist_error is not None and isinstance(error, dist_error) and "timed out" in text.lower():
            return True
    else:
        lines = [line for line in error.strip().splitlines() if line.strip()]
        text = lines[-1] if lines else ""
    return any(marker in text for marker in _SECONDARY_MARKERS)
