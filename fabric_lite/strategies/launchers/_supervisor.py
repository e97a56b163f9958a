"""Supervision of a launcher's ranks from the launching process, over a thin :class:`Rank` adapter per kind of
process: :func:`watch` until :class:`~fabric_lite.runtime.supervision.RootCause` names the root cause, :func:`report`
where every rank was, :func:`forward_signal`, :func:`stop`. The script launcher's :class:`ProcessSupervisor` applies
it from rank 0.

The job ends when its first rank fails. A child's traceback reaches rank 0 through an inherited pipe
(:func:`record_child_errors`), so no file is left behind. An error that only says a peer went away is *secondary*
(what the survivors of a crash see), reported only if no primary failure shows up shortly. After a failure every
other child is stopped (SIGTERM, a grace period, SIGKILL), and rank 0 exits if it does not fail by itself.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import select
import shutil
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from types import TracebackType
from typing import Protocol

from fabric_lite.runtime.diagnostics.hang_report import collect, print_report, wait_for_reporter, without_block
from fabric_lite.runtime.run import wait_for_saves
from fabric_lite.runtime.supervision import RankExit, RootCause, describe, is_secondary
from fabric_lite.strategies.launchers.launcher import ForwardSignals

# a child writes at most this much of its traceback (a pipe holds 64 KiB; the child must never block at exit)
_MAX_REPORT = 60_000


class Rank(Protocol):
    """A rank's process as a supervisor sees it (over ``subprocess.Popen`` or ``multiprocessing.Process``), with its
    global ``rank`` and ``local_rank``."""

    rank: int
    local_rank: int

    @property
    def pid(self) -> int:
        """Its process id."""

    def poll(self) -> int | None:
        """Its exit code (negative: the signal that ended it), or ``None`` while it runs."""

    def join(self, timeout: float | None) -> None:
        """Wait for it to exit, ``timeout`` seconds at most."""

    def error(self) -> str | None:
        """What it reported of its failure (its traceback), if anything; read once, when it has failed."""

    def reported(self) -> bool:
        """Whether it has reported an error (which :meth:`error` reads once it has ended)."""


def rank_exit(rank: Rank, code: int) -> RankExit:
    """The end of ``rank`` with exit code ``code``, for the verdict."""
    error = rank.error() if code > 0 else None
    return RankExit(rank.rank, code, error or None, rank.local_rank, rank.pid)


def watch(
    ranks: Sequence[Rank],
    verdict: RootCause,
    between: Callable[[], None],
    *,
    stopped: Callable[[], bool] = lambda: False,
    job_running: Callable[[], bool] = lambda: True,
) -> RankExit | None:
    """Tell ``verdict`` of every rank's end, calling ``between`` between rounds, until it names the root cause
    (returned); ``None`` once every rank has exited with code 0, or ``stopped()``. ``job_running()`` says whether a
    rank ending now ends while the job is meant to run."""
    seen: set[int] = set()
    while not stopped():
        running = False
        for rank in ranks:
            code = rank.poll()
            if code is None:
                running = True
            elif rank.rank not in seen:
                seen.add(rank.rank)
                verdict.saw(rank_exit(rank, code), job_running=job_running())
        cause = verdict.decide(exiting=verdict.failed and exiting(ranks))
        if cause is not None or not (running or verdict.failed):
            return cause
        between()
    return None


def exiting(ranks: Sequence[Rank]) -> bool:
    """Whether a rank that has reported an error is still running (on its way out)."""
    return any(rank.poll() is None and rank.reported() for rank in ranks)


def report(
    run_dir: str | None, reason: str, ranks: Sequence[Rank], world_size: int | None, own_rank: int | None = None
) -> None:
    """Print where every rank was (the hang report, from the trails in ``run_dir``), unless a rank has printed it
    already; ``own_rank`` is this process's rank, if it is one."""
    if run_dir is None:
        return
    codes = {r.rank: code for r in ranks if (code := r.poll()) is not None}
    pids = {r.rank: r.pid for r in ranks}
    if own_rank is not None:
        pids[own_rank] = os.getpid()
    print_report(
        lambda: collect(run_dir, reason=reason, exit_codes=codes, pids=pids, world_size=world_size, own_rank=own_rank),
        to_stderr,
    )


def forward_signal(ranks: Sequence[Rank], signum: int, grace: float, run_dir: str | None = None) -> None:
    """Pass ``signum`` on to every running rank, wait up to ``grace`` s, then :func:`stop` what is left."""
    for rank in ranks:
        _send_signal(rank, signum)
    _join_all(ranks, grace)  # for the ranks to act on the signal themselves (e.g. save a checkpoint on SIGTERM)
    stop(ranks, 1.0, run_dir)


def stop(ranks: Sequence[Rank], grace: float, run_dir: str | None = None) -> None:
    """SIGTERM every running rank, wait up to ``grace`` seconds, then SIGKILL what is left (a rank reporting where
    every rank was, or finishing a checkpoint write, in ``run_dir``, is let finish first)."""
    alive = [rank for rank in ranks if rank.poll() is None]
    wait_for_reporter(run_dir, {rank.pid: rank.join for rank in alive})
    wait_for_saves(run_dir, {rank.pid: partial(_exited_within, rank) for rank in alive})
    for rank in alive:
        _send_signal(rank, signal.SIGTERM)
    _join_all(alive, grace)
    for rank in alive:
        if rank.poll() is None:
            _send_signal(rank, signal.SIGKILL)
            rank.join(None)


def _exited_within(rank: Rank, seconds: float) -> bool:
    rank.join(seconds)
    return rank.poll() is not None


def _send_signal(rank: Rank, signum: int) -> None:
    """Send ``signum`` to ``rank`` unless it has exited (and so may have given its pid to another process)."""
    if rank.poll() is None:
        with contextlib.suppress(OSError):
            os.kill(rank.pid, signum)


def _join_all(ranks: Sequence[Rank], timeout: float) -> None:
    """Wait for every rank to exit, ``timeout`` seconds in all at most."""
    deadline = time.monotonic() + timeout
    for rank in ranks:
        rank.join(max(0.0, deadline - time.monotonic()))


def to_stderr(message: str) -> None:
    """Write ``message`` to stderr, ending in one newline; a stderr closed at exit is no error."""
    try:
        sys.stderr.write(message.rstrip("\n") + "\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass


# ---------------------------------------------------------------------------------------------- the script launcher
@dataclass
class Child:
    """A :class:`Rank` over ``Popen``, with the read end of the pipe it reports its error into."""

    rank: int
    local_rank: int
    process: subprocess.Popen[bytes]
    error_fd: int

    @property
    def pid(self) -> int:
        return self.process.pid

    def poll(self) -> int | None:
        return self.process.poll()

    def join(self, timeout: float | None) -> None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=timeout)

    def reported(self) -> bool:
        """Whether the pipe holds a report (asked while the child runs: it holds the write end, so no end of file)."""
        try:
            return bool(select.select([self.error_fd], [], [], 0)[0])
        except (OSError, ValueError):
            return False

    def error(self) -> str:
        """What the child wrote into its error pipe (empty if nothing), less the hang report it printed itself."""
        chunks = []
        while True:
            try:
                chunk = os.read(self.error_fd, 65536)
            except (BlockingIOError, OSError):
                break
            if not chunk:
                break
            chunks.append(chunk)
        return without_block(b"".join(chunks).decode(errors="replace")).rstrip()


#: the pipes this process reports its unhandled exception into
_recording: set[int] = set()


def record_child_errors(error_fd: int) -> None:
    """In a child: write an unhandled exception's traceback into the pipe rank 0 reads, as soon as Python reports it
    (before the exit handlers close the process group). Once per process."""
    if error_fd in _recording:
        return
    _recording.add(error_fd)
    try:
        os.set_blocking(error_fd, False)  # never block at exit, whatever happens to the reader
    except OSError:
        return
    written: list[BaseException] = []

    def write(exc: BaseException | None) -> None:
        if exc is None or written:
            return
        written.append(exc)
        text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        with contextlib.suppress(OSError):
            os.write(error_fd, text.encode(errors="replace")[-_MAX_REPORT:])

    def hook(kind: type[BaseException], exc: BaseException, tb: TracebackType | None) -> None:
        write(exc)
        previous(kind, exc, tb)

    previous = sys.excepthook
    sys.excepthook = hook
    atexit.register(lambda: write(getattr(sys, "last_value", None)))


class ProcessSupervisor:
    """Watches the children of the script launcher and ends the whole job when one fails.

    Args:
        children: the processes to watch, with the pipes they report their errors into.
        teardown: releases rank 0's process group at a normal exit, so a child waiting for rank 0 fails at once.
        run_dir: the run folder, whose trails give the hang report on a failure; removed after the job.
        world_size: the number of ranks, for that report.
    """

    #: how often the watching thread looks at the children, and how long a stopped child has before SIGKILL (s)
    poll_interval = 0.05
    grace = 3.0

    def __init__(
        self, children: list[Child], teardown: Callable[[], None], run_dir: str | None, world_size: int
    ) -> None:
        self.children = children
        self.run_dir = run_dir
        self.world_size = world_size
        self.teardown = teardown
        #: the root cause, once the job has failed
        self.failure: str | None = None
        self._rank0_finished = False
        # read and fed by the watching thread only; a secondary failure waits a second for the root cause
        self._verdict = RootCause(window=1.0)
        self._main_exiting = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="fabric_lite-supervisor", daemon=True)
        self._signals = ForwardSignals(self._pass_on_signal)

    def start(self) -> None:
        self._thread.start()
        self._signals.install()

    def _pass_on_signal(self, signum: int) -> None:
        """SIGTERM or SIGINT reached rank 0: tell every child, give them a grace period, then end them."""
        name = signal.Signals(signum).name
        self._claim(f"the job received {name}; it was passed on to every rank.")
        to_stderr(f"fabric_lite: received {name}; passing it on to the other ranks.")
        forward_signal(self.children, signum, self.grace, self.run_dir)

    # ------------------------------------------------------------------ watching
    def _run(self) -> None:
        cause = watch(
            self.children,
            self._verdict,
            lambda: time.sleep(self.poll_interval),
            stopped=lambda: self.failure is not None,
            job_running=lambda: not self._main_exiting.is_set(),
        )
        if cause is not None:
            self._on_failure(cause)

    def _early_exit(self) -> RankExit | None:
        """The first child that exited with code 0 while others still ran, if any (once a rank has lost its peer,
        such a child left early, noticed by the watching thread or not)."""
        return self._verdict.early_exit or next((rank_exit(c, 0) for c in self.children if c.poll() == 0), None)

    def _claim(self, description: str) -> bool:
        """Record the root cause; only the first claim counts, later failures are its consequences."""
        with self._lock:
            if self.failure is not None:
                return False
            self.failure = description
            return True

    def _on_failure(self, cause: RankExit) -> None:
        description = describe(cause, rank0_finished=self._rank0_finished)
        if not self._claim(description):
            return
        to_stderr(
            f"\nfabric_lite: the job failed. Root cause: {description}\n"
            "fabric_lite: stopping the other ranks; errors they report from now on are consequences of this failure."
        )
        reason = f"rank {cause.rank} ended ({description.splitlines()[0]})"
        report(self.run_dir, reason, self.children, self.world_size, own_rank=0)
        stop(self.children, self.grace, self.run_dir)
        # rank 0 usually fails on its own right away (its next collective loses its peer); if it is busy
        # elsewhere, end it so that the job does not outlive its failure
        if self._main_exiting.wait(self.grace):
            return
        to_stderr(f"fabric_lite: rank 0 did not stop within {self.grace:.0f} s of the failure; exiting.")
        self._remove_run_dir()
        os._exit(1)

    def _remove_run_dir(self) -> None:
        if self.run_dir is not None:
            shutil.rmtree(self.run_dir, ignore_errors=True)

    # ------------------------------------------------------------------ rank 0 exiting
    def wait_at_exit(self) -> None:
        """At rank 0's exit: find the root cause if something failed, stop or wait for the children."""
        atexit.unregister(self.wait_at_exit)
        self._main_exiting.set()
        self._signals.restore()
        rank0_error = getattr(sys, "last_value", None)
        if rank0_error is not None:
            if is_secondary(rank0_error):
                # rank 0 lost a peer: the child that went away is the root cause; give it time to exit (more while
                # a child that has reported its error is still exiting)
                start = time.monotonic()
                while self.failure is None and self._thread.is_alive():
                    limit = self._verdict.patience if exiting(self.children) else self.grace
                    if time.monotonic() - start >= limit:
                        break
                    self._thread.join(0.05)
                early = self._early_exit()
                if early is not None and self._claim(describe(early)):
                    to_stderr(f"\nfabric_lite: the job failed. Root cause: {self.failure}")
            if isinstance(rank0_error, KeyboardInterrupt):
                cause = "the job was interrupted (SIGINT / Ctrl+C); every rank was told."
            else:
                message = without_block(str(rank0_error), "").rstrip()
                cause = f"rank 0 failed: {type(rank0_error).__name__}: {message} (traceback above)."
            if self._claim(cause):
                to_stderr(
                    f"\nfabric_lite: the job failed. Root cause: {self.failure}\nfabric_lite: stopping the other ranks."
                )
                stop(self.children, self.grace, self.run_dir)
        else:
            self._rank0_finished = True
            self.teardown()
        while self._thread.is_alive():
            self._thread.join(0.1)
        for child in self.children:
            child.join(None)
            with contextlib.suppress(OSError):
                os.close(child.error_fd)
        self._remove_run_dir()
        if self.failure is not None and rank0_error is None:
            to_stderr(f"fabric_lite: exiting with code 1: {self.failure.splitlines()[0]}")
            sys.stdout.flush()
            os._exit(1)
