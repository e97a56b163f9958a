"""The environment of processes started by torchrun (``python -m torch.distributed.run``)."""

from __future__ import annotations

import os
from collections.abc import Mapping

from typing_extensions import override

from fabric_lite.plugins.environments.cluster_environment import _LauncherEnvironment
from fabric_lite.utilities.rank_zero import rank_zero_warn

#: the port where MASTER_PORT is unset, as in Lightning
_DEFAULT_PORT = 12910


class TorchElasticEnvironment(_LauncherEnvironment):
    """Processes started by torchrun, which fabric_lite never starts itself; detected by ``TORCHELASTIC_RUN_ID``.

    Reads ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``, ``GROUP_RANK`` (default 0), ``MASTER_ADDR``
    and ``MASTER_PORT`` (without them ``127.0.0.1`` and 12910, with a warning). ``devices`` and ``num_nodes`` must
    agree with torchrun's settings, or :meth:`validate_settings` raises ``ValueError`` naming both.

    Example::

        env = TorchElasticEnvironment()  # torchrun --nnodes 2 --nproc-per-node 2: the second process of node 1
        env.global_rank(), env.local_rank(), env.node_rank(), env.world_size()  # (3, 1, 1, 4)
    """

    _WORLD_SIZE, _GLOBAL_RANK, _LOCAL_RANK, _NODE_RANK = "WORLD_SIZE", "RANK", "LOCAL_RANK", "GROUP_RANK"

    @property
    @override
    def main_address(self) -> str:
        if "MASTER_ADDR" not in self._env:  # torchrun always sets it
            rank_zero_warn("MASTER_ADDR environment variable is not defined: using 127.0.0.1 (localhost)")
        return self._env.get("MASTER_ADDR", "127.0.0.1")

    @property
    @override
    def main_port(self) -> int:
        if "MASTER_PORT" not in self._env:  # torchrun always sets it
            rank_zero_warn(f"MASTER_PORT environment variable is not defined: using {_DEFAULT_PORT}")
        return self._int("MASTER_PORT", _DEFAULT_PORT)

    @staticmethod
    @override
    def detect(env: Mapping[str, str] | None = None) -> bool:
        return "TORCHELASTIC_RUN_ID" in (os.environ if env is None else env)

    @override
    def hosts_store(self, global_rank: int) -> bool:
        # torchrun's agent hosts the store on MASTER_PORT for its workers (TORCHELASTIC_USE_AGENT_STORE)
        return self._env.get("TORCHELASTIC_USE_AGENT_STORE") != "True" and global_rank == 0

    @override
    def store_prefix(self) -> str:
        # torchrun keeps its agent's store across restarts: without a prefix a restarted worker can read the gloo
        # addresses of the attempt that died and fail to connect ("Connection refused")
        return f"fabric_lite/attempt_{self._int('TORCHELASTIC_RESTART_COUNT', 0)}"

    def local_world_size(self) -> int | None:
        """``LOCAL_WORLD_SIZE``: the processes torchrun started on this node (``--nproc-per-node``)."""
        return self._int("LOCAL_WORLD_SIZE") if "LOCAL_WORLD_SIZE" in self._env else None

    @override
    def validate_settings(self, num_devices: int, num_nodes: int) -> None:
        world_size = self.world_size()
        local = self.local_world_size()
        if local is not None and local != num_devices:
            raise ValueError(
                f"Fabric(devices={num_devices}) does not match torchrun's --nproc-per-node={local}"
                f" (LOCAL_WORLD_SIZE). Set devices={local}, or start torchrun with --nproc-per-node={num_devices}."
            )
        if num_devices * num_nodes != world_size:
            hint = f" Set num_nodes={world_size // num_devices}." if world_size % num_devices == 0 else ""
            raise ValueError(
                f"Fabric(devices={num_devices}, num_nodes={num_nodes}) asks for {num_devices * num_nodes} processes,"
                f" but torchrun started WORLD_SIZE={world_size}: the product ({num_devices} * {num_nodes}) does not"
                f" match the world size ({world_size}).{hint}"
            )
