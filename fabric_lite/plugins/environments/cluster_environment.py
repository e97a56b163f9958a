"""The interface every cluster environment implements: where the ranks come from and how to reach rank 0."""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import ClassVar

from typing_extensions import override

from fabric_lite._log import get_logger
from fabric_lite.utilities.exceptions import MissingEnvironmentVariableError

log = get_logger(__name__)


class ClusterEnvironment(ABC):
    """Tells fabric_lite the ranks of this process and the address of the main process.

    An environment reads the launcher's variables when a value is asked for, never when it is created: it
    constructs where a variable is missing, and reading one it needs raises ``KeyError``. It reads ``env`` (copied;
    default ``os.environ`` itself, read at each call), so that the planner can build it from the mapping it plans from.

    Example::

        env = TorchElasticEnvironment({"RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4", "GROUP_RANK": "1"})
        env.global_rank(), env.local_rank(), env.node_rank(), env.world_size()  # (3, 1, 1, 4)
    """

    def __init__(self, env: Mapping[str, str] | None = None) -> None:
        # copied, so that what a plan was made from cannot change under it; None stands for os.environ, so that an
        # environment sent to a spawned process reads that process's variables (and pickles: os.environ does not)
        self._given_env: dict[str, str] | None = None if env is None else dict(env)

    @property
    def _env(self) -> Mapping[str, str]:
        """The variables this environment reads: the mapping it was given, else ``os.environ`` as it is now."""
        return os.environ if self._given_env is None else self._given_env

    @property
    @abstractmethod
    def creates_processes_externally(self) -> bool:
        """Whether something outside fabric_lite (torchrun, SLURM, a parent launcher) started every process."""

    @property
    @abstractmethod
    def main_address(self) -> str:
        """The address of the process with global rank 0."""

    @property
    @abstractmethod
    def main_port(self) -> int:
        """The port of the rendezvous store on the main process; ``0`` means "pick a free one at launch"."""

    @staticmethod
    @abstractmethod
    def detect(env: Mapping[str, str] | None = None) -> bool:
        """Whether the given environment (default ``os.environ``) is of this kind."""

    @abstractmethod
    def world_size(self) -> int:
        """The number of processes across all nodes."""

    @abstractmethod
    def set_world_size(self, size: int) -> None:
        """Set the world size, where the environment lets fabric_lite choose it."""

    @abstractmethod
    def global_rank(self) -> int:
        """The rank of this process across all nodes."""

    @abstractmethod
    def set_global_rank(self, rank: int) -> None:
        """Set the global rank, where the environment lets fabric_lite choose it."""

    @abstractmethod
    def local_rank(self) -> int:
        """The rank of this process on its node."""

    @abstractmethod
    def node_rank(self) -> int:
        """The index of this process's node."""

    def hosts_store(self, global_rank: int) -> bool:
        """Whether this process hosts the rendezvous store (rank 0, unless the launcher hosts it)."""
        return global_rank == 0

    def store_prefix(self) -> str:
        """A prefix for every rendezvous key, so that a restarted attempt never reads a dead attempt's keys."""
        return ""

    def validate_settings(self, num_devices: int, num_nodes: int) -> None:
        """Raise ``ValueError`` naming both sides where ``devices`` (processes per node) or ``num_nodes`` disagree with
        the environment; ``fabric.launch()`` calls it in every process before any other is started or waited on."""

    def teardown(self) -> None:
        """Clean up whatever the environment set up. Nothing by default."""

    def _on_setup(self, global_rank: int) -> None:
        """Called in every process by ``fabric.launch()`` with its global rank (SLURM installs its requeue handler)."""

    def _required(self, name: str) -> str:
        """The value of the variable ``name``, which this environment cannot work without."""
        value = self._env.get(name)
        if value is None:
            raise MissingEnvironmentVariableError(
                f"The environment variable {name} is not set, but {type(self).__name__} needs it."
                f" Start the script with the launcher that sets it, or set {name} yourself."
            )
        return value

    def _int(self, name: str, default: int | None = None) -> int:
        if default is not None and name not in self._env:
            return default
        value = self._required(name)
        try:
            return int(value)
        except ValueError:
            raise ValueError(f"The environment variable {name}={value!r} is not an integer.") from None


class _LauncherEnvironment(ClusterEnvironment):
    """Processes a launcher started with every rank fixed: each is read from a variable the subclass names
    (``_WORLD_SIZE``, ...), and the setters do nothing. Rank 0 is at ``MASTER_ADDR`` (default ``127.0.0.1``) and
    ``MASTER_PORT`` unless the subclass says otherwise."""

    #: the variables of the world size, the global rank, the local rank and the node rank
    _WORLD_SIZE: ClassVar[str]
    _GLOBAL_RANK: ClassVar[str]
    _LOCAL_RANK: ClassVar[str]
    _NODE_RANK: ClassVar[str]
    #: the node rank where its variable is unset (``None``: the variable is required)
    _NODE_RANK_DEFAULT: ClassVar[int | None] = 0

    @property
    @override
    def creates_processes_externally(self) -> bool:
        return True

    @property
    @override
    def main_address(self) -> str:
        return self._env.get("MASTER_ADDR", "127.0.0.1")

    @property
    @override
    def main_port(self) -> int:
        return self._int("MASTER_PORT")

    @override
    def world_size(self) -> int:
        return self._int(self._WORLD_SIZE)

    @override
    def set_world_size(self, size: int) -> None:
        log.debug("%s.set_world_size(%d) ignored: setting world size is not allowed", type(self).__name__, size)

    @override
    def global_rank(self) -> int:
        return self._int(self._GLOBAL_RANK)

    @override
    def set_global_rank(self, rank: int) -> None:
        log.debug("%s.set_global_rank(%d) ignored: setting global rank is not allowed", type(self).__name__, rank)

    @override
    def local_rank(self) -> int:
        return self._int(self._LOCAL_RANK)

    @override
    def node_rank(self) -> int:
        return self._int(self._NODE_RANK, self._NODE_RANK_DEFAULT)
