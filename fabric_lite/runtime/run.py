"""What a run is, as the launcher that started it says: who supervises the ranks, the folder for their trails, and the
rendezvous store. A launcher hands a :class:`RunContext` to the strategy; a process started as a new program reads it
with :meth:`RunContext.from_environment`; under other launchers it is empty. In the run folder, a rank finishing a
checkpoint write after a failure asks its launcher to wait for it (:func:`announce_save`, :func:`wait_for_saves`)."""

from __future__ import annotations

import contextlib
import math
import os
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Literal

ENV_RUN_DIR = "FABRIC_LITE_RUN_DIR"
ENV_LAUNCHER = "FABRIC_LITE_LAUNCHER"

#: ``"script"``: the ``ddp`` launcher (the script run again); ``"spawn"``: the ``multiprocessing`` launcher (spawn,
#: fork, forkserver); ``"cli"``: ``fabric-lite run`` (torchrun's agent starts the ranks)
LauncherKind = Literal["script", "spawn", "cli"]
_KINDS: tuple[LauncherKind, ...] = ("script", "spawn", "cli")


@dataclass(frozen=True)
class RunContext:
    """The run this process belongs to.

    Attributes:
        launcher: which of fabric_lite's launchers started the ranks; ``None`` for any other.
        run_dir: the run folder the launcher made for the ranks' trails (and removes after the job), else ``None``.
        store: the rendezvous store the launcher made; the main process holds its port before the first child starts.
        local_rank: this process's local rank, where the launcher knows it better than the environment.
    """

    launcher: LauncherKind | None = None
    run_dir: str | None = None
    store: Any = None
    local_rank: int | None = None

    def __post_init__(self) -> None:
        if self.launcher is not None and self.launcher not in _KINDS:
            raise ValueError(f"RunContext(launcher={self.launcher!r}) is not one of {_KINDS} or None.")

    @property
    def supervised(self) -> bool:
        """Whether the launcher watches the ranks itself, and so reports a rank's death with the hang report (torchrun's
        agent, under ``fabric-lite run`` or alone, only ends the survivors: there each rank reports)."""
        return self.launcher in ("script", "spawn")

    @property
    def launcher_removes_run_dir(self) -> bool:
        """Whether the launcher removes the run folder after the job; otherwise each rank removes its own files."""
        return self.launcher is not None

    def environment(self) -> dict[str, str]:
        """The variables that carry the launcher and run folder to a process started as a new program."""
        if self.launcher is None or self.run_dir is None:
            return {}
        return {ENV_RUN_DIR: self.run_dir, ENV_LAUNCHER: self.launcher}

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] | None = None) -> RunContext:
        """The context a launcher gave this process through its environment (:meth:`environment`); empty if none."""
        environ = os.environ if environ is None else environ
        launcher = environ.get(ENV_LAUNCHER)
        if launcher not in _KINDS:
            launcher = None
        return cls(launcher=launcher, run_dir=environ.get(ENV_RUN_DIR) or None)


# ------------------------------------------------------------------------------ a save finished after a failure
def _saving_marker(run_dir: str, pid: int) -> str:
    return os.path.join(run_dir, f"saving.{pid}")


@contextmanager
def announce_save(run_dir: str | None, timeout: float | None) -> Iterator[None]:
    """In a rank that failed (or lost a peer) with a checkpoint write in flight: tell the launcher, through the run
    folder, that this process is finishing the write for up to ``timeout`` seconds (``None``: until done), so that it
    does not stop the process half-way (:func:`wait_for_saves`). Nothing without a run folder."""
    path = None if run_dir is None else _saving_marker(run_dir, os.getpid())
    if path is not None:
        deadline = "none" if timeout is None else repr(time.time() + timeout)
        with contextlib.suppress(OSError):
            with open(path + ".part", "w") as marker:
                marker.write(deadline)
            os.replace(path + ".part", path)  # whole: the launcher never reads it half-written
    try:
        yield
    finally:
        if path is not None:
            with contextlib.suppress(OSError):
                os.unlink(path)


def wait_for_saves(run_dir: str | None, processes: Mapping[int, Callable[[float], bool]]) -> None:
    """Before a launcher stops its ranks after a failure (``processes``: pid -> ``wait(seconds)``, which returns whether
    the process has exited), let every rank that announced a write in flight (:func:`announce_save`) finish it, until
    it exits, withdraws the announcement, or its deadline passes: a failure elsewhere must not lose the checkpoint."""
    if run_dir is None:
        return
    for pid, wait in processes.items():
        path = _saving_marker(run_dir, pid)
        try:
            with open(path) as marker:
                text = marker.read().strip()
        except OSError:
            continue  # not saving
        deadline = math.inf if text == "none" else float(text or 0.0)
        while os.path.exists(path) and time.time() < deadline:
            if wait(min(0.05, max(0.0, deadline - time.time()))):
                break
