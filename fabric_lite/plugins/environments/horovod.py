"""The ranks that ``horovodrun`` (or Open MPI's ``mpirun``) gives each process, read from its variables."""

from __future__ import annotations

from collections.abc import Mapping

from typing_extensions import override

from fabric_lite.plugins.environments.cluster_environment import ClusterEnvironment


class HorovodEnvironment(ClusterEnvironment):
    """The ranks ``horovodrun`` (or Open MPI's ``mpirun``) gave this process: ``HOROVOD_RANK``, ``HOROVOD_SIZE``,
    ``HOROVOD_LOCAL_RANK``, ``HOROVOD_LOCAL_SIZE`` and ``HOROVOD_CROSS_RANK``, or ``OMPI_COMM_WORLD_*``; without them,
    rank 0 of 1. They serve until ``hvd.init()``; then :class:`~fabric_lite.strategies.horovod.HorovodStrategy` asks
    Horovod.

    Example::

        HorovodEnvironment({"HOROVOD_RANK": "1", "HOROVOD_SIZE": "2"}).global_rank()  # 1
    """

    _VARIABLES = (
        ("HOROVOD_RANK", "HOROVOD_SIZE", "HOROVOD_LOCAL_RANK", "HOROVOD_LOCAL_SIZE"),
        ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"),
    )

    def _names(self) -> tuple[str, str, str, str] | None:
        return next((names for names in self._VARIABLES if names[0] in self._env and names[1] in self._env), None)

    @property
    @override
    def creates_processes_externally(self) -> bool:
        return self._names() is not None

    @property
    @override
    def main_address(self) -> str:
        return self._env.get("HOROVOD_GLOO_RENDEZVOUS_ADDR", "127.0.0.1")

    @property
    @override
    def main_port(self) -> int:
        return self._int("HOROVOD_GLOO_RENDEZVOUS_PORT", 0)

    @staticmethod
    @override
    def detect(env: Mapping[str, str] | None = None) -> bool:
        return HorovodEnvironment(env).creates_processes_externally

    def _get(self, index: int, default: int) -> int:
        names = self._names()
        return default if names is None else self._int(names[index], default)

    @override
    def world_size(self) -> int:
        return self._get(1, 1)

    @override
    def set_world_size(self, size: int) -> None:
        """Nothing to set: ``horovodrun`` decides."""

    @override
    def global_rank(self) -> int:
        return self._get(0, 0)

    @override
    def set_global_rank(self, rank: int) -> None:
        """Nothing to set: ``horovodrun`` decides."""

    @override
    def local_rank(self) -> int:
        return self._get(2, 0)

    def local_world_size(self) -> int:
        """How many processes ``horovodrun`` started on this node (1 without it)."""
        return self._get(3, 1)

    @override
    def node_rank(self) -> int:
        return self._int("HOROVOD_CROSS_RANK", 0)

    @override
    def validate_settings(self, num_devices: int, num_nodes: int) -> None:
        """``horovodrun`` decides the processes: ``devices`` must match what it started, ``num_nodes`` stays 1."""
        if num_nodes != 1:
            raise ValueError(
                f"Fabric(strategy='horovod', num_nodes={num_nodes}): horovodrun decides the nodes (e.g."
                " `horovodrun -np 8 -H node0:4,node1:4 python train.py`). Leave num_nodes=1."
            )
        local = self.local_world_size()
        if not self.creates_processes_externally:
            if num_devices > 1:
                raise ValueError(
                    f"strategy='horovod' starts no processes itself, but devices asks for {num_devices} processes"
                    " and this process was not started by horovodrun. Start the script with horovodrun, e.g."
                    f" `horovodrun -np {num_devices} -H localhost:{num_devices} python train.py`, and leave"
                    " devices='auto'."
                )
            return
        if num_devices != local:
            raise ValueError(
                f"devices asks for {num_devices} process(es) on this node, but horovodrun started {local} here"
                f" (HOROVOD_LOCAL_SIZE={local}). Leave devices='auto' under horovodrun: it takes horovodrun's count."
            )
