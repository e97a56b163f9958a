"""The environment of a Kubeflow ``PyTorchJob``: one process per pod, ranks from the operator's variables."""

from __future__ import annotations

from collections.abc import Mapping

from typing_extensions import override

from fabric_lite.plugins.environments.cluster_environment import _LauncherEnvironment


class KubeflowEnvironment(_LauncherEnvironment):
    """Processes started by the Kubeflow training operator's ``PyTorchJob``, one per pod.

    Reads ``MASTER_ADDR``, ``MASTER_PORT``, ``WORLD_SIZE`` and ``RANK``; the local rank is 0 and the node rank the
    global rank. Never detected (torchrun and users set the same variables), as in Lightning: pass it as a plugin.

    Example::

        fabric = Fabric(devices=1, num_nodes=4, plugins=[KubeflowEnvironment()])  # in each pod of a 4-replica job
    """

    _WORLD_SIZE, _GLOBAL_RANK = "WORLD_SIZE", "RANK"

    @property
    @override
    def main_address(self) -> str:
        return self._required("MASTER_ADDR")  # the PyTorchJob operator sets it

    @staticmethod
    @override
    def detect(env: Mapping[str, str] | None = None) -> bool:
        """Raises ``NotImplementedError``, as in Lightning: pass the environment as a plugin."""
        raise NotImplementedError(
            "The Kubeflow environment can't be detected automatically: pass"
            " Fabric(plugins=[KubeflowEnvironment()]) in a PyTorchJob."
        )

    @override
    def local_rank(self) -> int:
        return 0

    @override
    def node_rank(self) -> int:
        return self.global_rank()

    @override
    def validate_settings(self, num_devices: int, num_nodes: int) -> None:
        """One process per pod: ``devices`` must be 1 and ``num_nodes`` the job's ``WORLD_SIZE``."""
        world_size = self.world_size()
        if num_devices != 1 or num_nodes != world_size:
            raise ValueError(
                f"Fabric(devices={num_devices}, num_nodes={num_nodes}) does not match the PyTorchJob, which runs one"
                f" process in each of its WORLD_SIZE={world_size} pods. Set devices=1, num_nodes={world_size}."
            )
