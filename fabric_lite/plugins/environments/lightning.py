"""The environment of fabric_lite's own launchers (script re-run, spawn, fork) and of manual multi-node runs."""

from __future__ import annotations

import os
from collections.abc import Mapping

from typing_extensions import override

from fabric_lite.plugins.environments.cluster_environment import ClusterEnvironment


class LightningEnvironment(ClusterEnvironment):
    """The default environment: fabric_lite starts the processes itself.

    The process the user starts is local rank 0 and starts the others, which see ``LOCAL_RANK`` and ``WORLD_SIZE``
    and start none. On several nodes, start the script on each with the same ``MASTER_ADDR`` and ``MASTER_PORT``
    and its ``NODE_RANK`` (or ``GROUP_RANK``); the defaults are ``127.0.0.1``, a free port held by rank 0, node 0.

    Example::

        # on the second of two nodes (Fabric(num_nodes=2) in train.py):
        #   MASTER_ADDR=10.0.0.1 MASTER_PORT=29500 NODE_RANK=1 python train.py
        LightningEnvironment().node_rank()  # 1
    """

    def __init__(self, env: Mapping[str, str] | None = None) -> None:
        super().__init__(env)
        self._global_rank = 0
        self._world_size = self._int("WORLD_SIZE", 1)

    @property
    @override
    def creates_processes_externally(self) -> bool:
        return "LOCAL_RANK" in self._env

    @property
    @override
    def main_address(self) -> str:
        return self._env.get("MASTER_ADDR", "127.0.0.1")

    @property
    @override
    def main_port(self) -> int:
        return self._int("MASTER_PORT", 0)

    @staticmethod
    @override
    def detect(env: Mapping[str, str] | None = None) -> bool:
        return True

    @override
    def world_size(self) -> int:
        return self._world_size

    @override
    def set_world_size(self, size: int) -> None:
        self._world_size = size

    @override
    def global_rank(self) -> int:
        return self._global_rank

    @override
    def set_global_rank(self, rank: int) -> None:
        self._global_rank = rank

    @override
    def local_rank(self) -> int:
        return self._int("LOCAL_RANK", 0)

    @override
    def node_rank(self) -> int:
        return self._int("NODE_RANK") if "NODE_RANK" in self._env else self._int("GROUP_RANK", 0)

    @override
    def teardown(self) -> None:
        """Remove ``WORLD_SIZE`` from the variables read (``os.environ`` when given none), as Lightning does, so that
        a later ``Fabric`` in the process does not take it for its own."""
        variables = os.environ if self._given_env is None else self._given_env
        variables.pop("WORLD_SIZE", None)

    @override
    def validate_settings(self, num_devices: int, num_nodes: int) -> None:
        """Raise ``ValueError`` where several nodes lack ``MASTER_ADDR``/``MASTER_PORT`` (each node would wait on its
        own address until the timeout), or a process the launcher started asks for another ``WORLD_SIZE``."""
        if not self.creates_processes_externally:
            missing = [name for name in ("MASTER_ADDR", "MASTER_PORT") if name not in self._env]
            if num_nodes > 1 and missing:
                raise ValueError(
                    f"Fabric(num_nodes={num_nodes}) without torchrun or SLURM needs {' and '.join(missing)}: start the"
                    " script on every node with the same MASTER_ADDR (the first node's address) and MASTER_PORT, and"
                    " NODE_RANK=0, 1, ... (or launch with torchrun or srun)."
                )
            return
        if "WORLD_SIZE" not in self._env:
            return
        if num_devices * num_nodes != self._world_size:
            raise ValueError(
                f"This process was started with WORLD_SIZE={self._world_size}, but Fabric(devices={num_devices},"
                f" num_nodes={num_nodes}) asks for {num_devices * num_nodes} processes. Use the same settings in"
                " every process (or unset LOCAL_RANK and WORLD_SIZE if you did not mean to start it as a child)."
            )
