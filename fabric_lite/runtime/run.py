"""What a run is, as the launcher that started it says: who supervises the ranks, the folder for their trails, and the
rendezvous store. A launcher hands a :class:`RunContext` to the strategy; a process started as a new program reads it
with :meth:`RunContext.from_environment`; under other launchers it is empty."""

from __future__ import annotations

import os
from collections.abc import Mapping
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
