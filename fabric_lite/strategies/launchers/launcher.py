"""The launcher interface and what every launched child process does first."""

from __future__ import annotations

import os
import select
import signal
import sys
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any

from fabric_lite.runtime.diagnostics.hang_report import WakeupWatch

# set by fabric_lite's launchers in the environment of the processes they start
ENV_PARENT_PID = "FABRIC_LITE_PARENT_PID"
ENV_ERROR_FD = "FABRIC_LITE_ERROR_FD"
_PR_SET_PDEATHSIG = 1
# how often, and how far apart, a signal that reached another thread is redirected to the main thread
_KICKS = 250
_KICK_INTERVAL = 0.02
#: how long restore() waits for the watching thread to end after closing its pipe (it ends at once when idle)
_WATCHER_EXIT_S = 10.0


class Launcher(ABC):
    """Starts the processes a strategy needs and runs a function in them.

    Example::

        launcher = Fabric(accelerator="cpu", devices=2, strategy="ddp_spawn").strategy.launcher
    """

    #: whether ``fabric.launch()`` needs a function (the processes it starts run only that function)
    requires_function: bool = False

    @abstractmethod
    def launch(self, function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Start the processes (if any) and run ``function(*args, **kwargs)``; return its result (see subclasses)."""

    @property
    def is_interactive_compatible(self) -> bool:
        """Whether it works in a notebook or REPL."""
        return False


class ForwardSignals:
    """While active, SIGTERM and SIGINT sent to this (launching) process are passed on to its ranks first
    (``stop(signum)``); then the process reacts as it would have. Only default handlers are replaced, from the main
    thread, until :meth:`restore`. A signal that lands on another thread, or just before the main thread blocks,
    is redirected to the main thread (``WakeupWatch``), else it would wait for the blocking call to return."""

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self, stop: Callable[[int], None]) -> None:
        self._stop = stop
        self._previous: dict[int, Any] = {}
        self._handling = False
        self._watch = WakeupWatch()

    def install(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for signum in self.SIGNALS:
            current = signal.getsignal(signum)
            if current in (signal.SIG_DFL, signal.default_int_handler):
                self._previous[signum] = current
                signal.signal(signum, self._forward)
        if self._previous:
            self._watch.start(self._kick, "fabric_lite-signals")

    def _kick(self, signum: int) -> None:
        # Repeat until the handler runs: a signal that lands on the main thread after its last check but
        # before it blocks (e.g. entering time.sleep) only flags the handler, and sleeps on; so can a kick.
        main = threading.main_thread().ident
        if signum not in self._previous or main is None:
            return
        for _ in range(_KICKS):
            if self._handling or not self._watch.active:
                return
            signal.pthread_kill(main, signum)
            time.sleep(_KICK_INTERVAL)

    def restore(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for signum, previous in self._previous.items():
            if signal.getsignal(signum) == self._forward:
                signal.signal(signum, previous)
        self._previous.clear()
        # wait for the thread: a launch that returned holds no thread of ours
        self._watch.stop(timeout=_WATCHER_EXIT_S)

    def _forward(self, signum: int, frame: Any) -> None:
        if self._handling:  # the same signal redirected to this thread while it is already being handled
            return
        self._handling = True
        previous = self._previous.get(signum, signal.SIG_DFL)
        try:
            self._stop(signum)
        finally:
            self.restore()
            self._handling = False
        if signum == signal.SIGINT and previous is signal.default_int_handler:
            raise KeyboardInterrupt
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)


def die_with_launcher(launcher_pid: int, is_parent: bool = True) -> None:
    """Make this process die (SIGKILL) when the launcher does, so a SIGKILL to the launcher leaves no orphan (Linux
    only): through ``prctl(PR_SET_PDEATHSIG)`` where the launcher is the parent, else (a fork server's child) a
    thread waiting on the launcher's pidfd."""
    if not sys.platform.startswith("linux"):
        return
    if not is_parent:
        try:
            pidfd = os.pidfd_open(launcher_pid)
        except ProcessLookupError:
            os._exit(1)
        except OSError:  # a kernel without pidfds (before Linux 5.3): nothing to wait on
            return
        threading.Thread(
            target=_die_when_readable, args=(pidfd,), name="fabric_lite-launcher-watch", daemon=True
        ).start()
        return
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != launcher_pid:
        os._exit(1)


def _die_when_readable(pidfd: int) -> None:
    select.select([pidfd], [], [])  # a pidfd becomes readable when its process exits
    os.kill(os.getpid(), signal.SIGKILL)


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
