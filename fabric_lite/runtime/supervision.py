"""The supervision policy every launcher applies when a rank fails: which rank's end is the root cause, and which only
report that another rank went away. A launcher turns each end it hears of into a :class:`RankExit` and asks one
:class:`RootCause` for the verdict."""

from __future__ import annotations

import signal
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch.distributed as dist

#: what an error looks like when it is only the consequence of another rank going away
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


def is_secondary(error: BaseException | str) -> bool:
    """Whether an error (or the last line of a traceback) only reports that another rank went away."""
    if isinstance(error, BaseException):
        dist_error = getattr(dist, "DistError", None)
        text = f"{type(error).__name__}: {error}"
        if dist_error is not None and isinstance(error, dist_error) and "timed out" in text.lower():
            return True
    else:
        text = _last_line(error)
    return any(marker in text for marker in _SECONDARY_MARKERS)


@dataclass(frozen=True)
class RankExit:
    """A rank that ended, as its launcher saw it: its global ``rank``, exit ``code`` (negative: the signal), the
    ``error`` it reported (its traceback), and its ``local_rank`` and ``pid`` where the launcher knows them."""

    rank: int
    code: int
    error: str | None = None
    local_rank: int | None = None
    pid: int | None = None

    @property
    def failed(self) -> bool:
        return self.code != 0

    @property
    def secondary(self) -> bool:
        """A failure whose own error only says that a peer went away: the consequence of another rank's end."""
        return self.code > 0 and bool(self.error) and is_secondary(self.error or "")


@dataclass
class RootCause:
    """The verdict on a job from the ends of its ranks, the same under every launcher.

    A primary failure (an exception, a signal, a silent non-zero exit) is the root cause at once. A secondary one (its
    error only says that a peer went away) waits ``window`` seconds for a primary one, or ``patience`` while a rank that
    reported an error is still ``exiting``: the rank that failed may close its connections seconds before it ends. Then
    a rank that exited 0 while the others ran is the cause (it returned early), else the first secondary failure.

    Example::

        verdict = RootCause(window=1.0)
        verdict.saw(RankExit(rank=2, code=-9))
        verdict.decide()  # RankExit(rank=2, code=-9): killed, the root cause
    """

    window: float = 1.0
    patience: float = 30.0
    clock: Callable[[], float] = time.monotonic
    #: the root cause, once decided
    cause: RankExit | None = None
    _secondary: RankExit | None = None
    _secondary_at: float = 0.0
    _early: list[RankExit] = field(default_factory=list)

    def saw(self, exit: RankExit, *, job_running: bool = True) -> None:
        """Record that a rank ended (``job_running``: while the job was still meant to run, not at its end)."""
        if self.cause is not None:
            return
        if not exit.failed:
            if job_running:
                self._early.append(exit)
            return
        if not exit.secondary:
            self.cause = exit
        elif self._secondary is None:
            self._secondary, self._secondary_at = exit, self.clock()

    def decide(self, *, waited: bool = False, exiting: bool = False) -> RankExit | None:
        """The root cause, or ``None`` while none is known (``waited``: stop waiting for a primary failure; ``exiting``:
        a rank that reported an error has not ended yet)."""
        waited = waited or self.clock() - self._secondary_at >= (self.patience if exiting else self.window)
        if self.cause is None and self._secondary is not None and waited:
            self.cause = self.early_exit or self._secondary
        return self.cause

    @property
    def early_exit(self) -> RankExit | None:
        """The first rank seen to exit with code 0 while the job was running, if any."""
        return self._early[0] if self._early else None

    @property
    def failed(self) -> bool:
        """Whether any rank has failed (a root cause may still be waited for)."""
        return self.cause is not None or self._secondary is not None


def signal_name(code: int) -> str | None:
    """``"SIGKILL"`` for the exit code of a process that a known signal ended (-9), else ``None``."""
    return signal.Signals(-code).name if code < 0 and -code in signal.Signals._value2member_map_ else None


def how_it_ended(code: int) -> str:
    """``killed by SIGKILL`` for an exit code that is a signal's (negative), else ``exited with code 1``."""
    name = signal_name(code)
    return f"killed by {name}" if name else f"exited with code {code}"


_NO_ERROR_FILE = "<N/A>"  # torchrun's ProcessFailure.error_file where the rank wrote none


def from_torchrun(failures: Mapping[int, Any]) -> RankExit | None:
    """The root cause among torchrun's agent's failures (``ChildFailedError.failures``), by the same policy: a primary
    failure wins whatever the timestamps, and a rank the agent stopped with SIGTERM comes last (timestamps are whole
    seconds). A rank's error is its traceback where torch's error recorder wrote one, else the agent's message."""
    verdict = RootCause(window=0.0)

    def order(item: tuple[int, Any]) -> tuple[bool, int, int]:
        rank, failure = item
        return failure.exitcode == -signal.SIGTERM, failure.timestamp, rank

    for rank, failure in sorted(failures.items(), key=order):
        message = failure.message
        if isinstance(message, dict):  # what torch's error recorder wrote: the exception and its traceback
            error = message.get("extraInfo", {}).get("py_callstack") or message.get("message")
        else:  # an error file's plain message, or the agent's own words where the rank wrote no file
            error = message if failure.error_file != _NO_ERROR_FILE else None
        verdict.saw(RankExit(rank, failure.exitcode, error or None, failure.local_rank, failure.pid))
    return verdict.decide(waited=True)


def describe(exit: RankExit, *, rank0_finished: bool = False, traceback: bool = True) -> str:
    """The root cause in words, the same under every launcher (``traceback=False``: its last line only)."""
    known = {"local rank": exit.local_rank, "pid": exit.pid}
    where = ", ".join(f"{name} {value}" for name, value in known.items() if value is not None)
    who = f"rank {exit.rank}" + (f" ({where})" if where else "")
    if exit.code == 0:
        return (
            f"{who} exited with code 0 while the other ranks were still running: they then lost their peer in a"
            " collective. Every rank must run the same collectives; a rank must not return early (e.g. on its own"
            " stopping condition)."
        )
    if exit.code < 0:
        return f"{who} was killed by {signal_name(exit.code) or f'signal {-exit.code}'}."
    if not exit.error:
        return f"{who} exited with code {exit.code} (its own output above says why)."
    if traceback:
        text = f"{who} failed with exit code {exit.code}. Its traceback:\n{exit.error.rstrip()}"
    else:
        text = f"{who} failed with exit code {exit.code}: {_last_line(exit.error)}"
    if exit.secondary and rank0_finished:
        text += (
            "\n(Rank 0 had already finished: the ranks did not run the same collectives. Check that every rank"
            " calls the same collectives, the same number of times.)"
        )
    return text


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else ""
