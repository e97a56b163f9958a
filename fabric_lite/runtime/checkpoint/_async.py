"""Checkpoints written in the background, one at a time, their errors never lost: a failed write raises at the next
save, at ``wait()`` (``fabric.load``, the end of ``launch``, ``teardown``), or at exit, which then exits with code 1."""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
import threading
import time
from collections.abc import Callable

from fabric_lite.runtime.checkpoint.files import CheckpointError

#: how much lower than the training threads the writer runs (a thread is a task on Linux): on a small machine the
#: training steps win the CPU and the write takes the idle time
_WRITER_NICENESS = 10


class _BackgroundSave:
    """Runs one checkpoint write at a time in a background thread.

    Example::

        background.submit(lambda: atomic_save(staged, path), str(path))  # returns at once
        background.wait()  # raises CheckpointError if the write failed
    """

    def __init__(self) -> None:
        self._thread: threading.Thread | None = None
        self._path = ""
        self._error: BaseException | None = None
        #: the end of the last finished write (``time.monotonic()``), for measurements
        self.finished_at = 0.0
        self._failed_at_exit = False
        self._exit_waiter_registered = False
        # the hook that turns a write that failed at exit into exit code 1 must run after every other exit hook
        # (loggers, the launcher's, the process group's): registered first, it runs last
        atexit.register(self._exit_code)

    def __getstate__(self) -> dict[str, object]:
        return {}  # a copy in another process (spawn) starts with no write in flight and its own exit hooks

    def __setstate__(self, state: dict[str, object]) -> None:
        self.__init__()  # type: ignore[misc]

    @property
    def in_flight(self) -> bool:
        """Whether a write is running now."""
        return self._thread is not None and self._thread.is_alive()

    def submit(self, job: Callable[[], object], path: str) -> None:
        """Wait for the previous write (raising its error: this save is then not started), then run ``job`` in the
        background. ``path`` names the checkpoint in error messages."""
        self.wait()
        if not self._exit_waiter_registered:
            # registered after the process group exists, so it runs before the group is destroyed at exit
            atexit.register(self._wait_at_exit)
            self._exit_waiter_registered = True
        self._path = path
        self._thread = threading.Thread(target=self._run, args=(job,), name="fabric_lite-checkpoint", daemon=False)
        self._thread.start()

    def _run(self, job: Callable[[], object]) -> None:
        if hasattr(os, "setpriority") and sys.platform.startswith("linux"):
            with contextlib.suppress(OSError):
                os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), _WRITER_NICENESS)
        try:
            job()
        except BaseException as err:
            self._error = err
        finally:
            self.finished_at = time.monotonic()

    def join(self, timeout: float | None = None) -> bool:
        """Wait up to ``timeout`` seconds (forever for ``None``) for the write in flight; whether none is left."""
        thread = self._thread
        if thread is not None:
            thread.join(timeout)
        return thread is None or not thread.is_alive()

    def wait(self) -> None:
        """Block until the write in flight is done; raise its :class:`CheckpointError` once if it failed (the checkpoint
        at its path is then the previous one)."""
        self.join()
        error, self._error = self._error, None
        if error is not None:
            raise self._describe(error) from error

    def take_error(self) -> CheckpointError | None:
        """The last write's error, as :meth:`wait` would raise it, without raising; cleared once taken."""
        error, self._error = self._error, None
        return None if error is None else self._describe(error)

    def _describe(self, error: BaseException) -> CheckpointError:
        if isinstance(error, CheckpointError):  # already says what failed, and where
            detail = str(error)
        else:
            detail = f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
        if self._path in detail:
            return CheckpointError(f"The background save failed: {detail}")
        return CheckpointError(f"The background save to {self._path!r} failed: {detail}")

    def _wait_at_exit(self) -> None:
        self.join()
        error = self.take_error()
        if error is not None:
            print(f"fabric_lite: {error}", file=sys.stderr, flush=True)
            self._failed_at_exit = True

    def _exit_code(self) -> None:
        if self._failed_at_exit:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(1)  # a process whose last checkpoint was not written must not exit 0
