"""What a run is, as the launcher that started it says: who supervises the ranks, the folder where they leave their
trails of collectives, and the rendezvous store the launcher holds.

A launcher of fabric_lite makes one :class:`RunContext` and hands it to the strategy
(:meth:`~fabric_lite.strategies.parallel.ParallelStrategy.attach_run`). A process that a launcher started as a new
program (the script launcher's children, ``fabric-lite run``'s workers) reads it back from its environment in one
place, :meth:`RunContext.from_environment`; under any other launcher (plain torchrun, srun, mpirun, a process group
the user made) it is empty, and each rank derives the same node-local run folder from the job's rendezvous settings.
"""

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
        launcher: which of fabric_lite's launchers started the ranks; ``None`` for any other (torchrun, srun,
            mpirun, the user).
        run_dir: the run folder the launcher made for the ranks' trails (it reads them when a rank dies, and
            removes the folder after the job); ``None`` where no launcher of ours made one.
        store: the rendezvous store this process reaches the others through, when the launcher made it (the main
            process holds the port from before the first child starts, so no other job can take it).
        local_rank: this process's local rank, when the launcher knows it better than the environment (the
            ``multiprocessing`` launcher's workers share one environment).
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
        """Whether the launcher removes the whole run folder after the job; otherwise each rank removes its own
        files as it ends."""
        return self.launcher is not None

    def environment(self) -> dict[str, str]:
        """The variables that carry this context to a process started as a new program (only the launcher and the
        run folder travel: a store and a local rank belong to one process)."""
        if self.launcher is None or self.run_dir is None:
            return {}
        return {ENV_RUN_DIR: self.run_dir, ENV_LAUNCHER: self.launcher}

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] | None = None) -> RunContext:
        """The context a launcher of ours gave this process through its environment (:meth:`environment`); empty
        where there is none."""
        environ = os.environ if environ is None else environ
        launcher = environ.get(ENV_LAUNCHER) or None
        run_dir = environ.get(ENV_RUN_DIR) or None
        if launcher not in _KINDS:
            launcher = None
        return cls(launcher=launcher, run_dir=run_dir)
