"""The environment of processes started by SLURM's ``srun``."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

from typing_extensions import override

from fabric_lite.plugins.environments.cluster_environment import ClusterEnvironment

# Job names that mean "an interactive shell inside an allocation", where the user starts processes by other means.
_INTERACTIVE_JOB_NAMES = ("bash", "interactive")


def first_host(nodelist: str) -> str:
    """The first host of a SLURM host list.

    Handles plain lists separated by commas or spaces and bracketed ranges, including several bracket groups and
    zero padding: ``"node[3-5,9]"`` gives ``"node3"``, ``"gpu[007-009],cpu1"`` gives ``"gpu007"``,
    ``"rack[1-2]-n[4,6]"`` gives ``"rack1-n4"``.
    """
    text = nodelist.strip()
    if not text:
        raise ValueError("SLURM_NODELIST is empty; cannot tell which host is the main node. Set MASTER_ADDR.")
    # the first host ends at the first comma or space outside brackets
    depth = 0
    end = len(text)
    for i, ch in enumerate(text):
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        elif ch in ", " and depth == 0:
            end = i
            break
    host = text[:end]
    # replace every bracket group by its first entry: "3-5,9" -> "3"
    return re.sub(r"\[([^\]\-,]*)[^\]]*\]", r"\1", host)


def _slurm_interactive(env: Mapping[str, str]) -> bool:
    return env.get("SLURM_JOB_NAME") in _INTERACTIVE_JOB_NAMES


class SLURMEnvironment(ClusterEnvironment):
    """Processes started by ``srun`` (directly or inside an ``sbatch`` script); fabric_lite starts none itself.

    Reads ``SLURM_PROCID``, ``SLURM_LOCALID``, ``SLURM_NODEID``, ``SLURM_NTASKS``, ``SLURM_NTASKS_PER_NODE``,
    ``SLURM_NNODES``, ``SLURM_NODELIST`` and ``SLURM_JOB_ID``. The main address is ``MASTER_ADDR`` or else the first
    host of ``SLURM_NODELIST``; the port is ``MASTER_PORT`` or else ``15000 +`` the last four digits of the job id
    (the same choice as Lightning, so every task computes the same port without talking to the others).

    A job named ``bash`` or ``interactive`` (an ``salloc`` shell) is not detected as SLURM, so that you can start
    processes in it by other means, as in Lightning.
    """

    @property
    @override
    def creates_processes_externally(self) -> bool:
        return True

    @property
    @override
    def main_address(self) -> str:
        if "MASTER_ADDR" in self._env:
            return self._env["MASTER_ADDR"]
        return first_host(self._env.get("SLURM_NODELIST", self._env.get("SLURM_JOB_NODELIST", "127.0.0.1")))

    @property
    @override
    def main_port(self) -> int:
        if "MASTER_PORT" in self._env:
            return self._int("MASTER_PORT")
        job_id = self._env.get("SLURM_JOB_ID", "")
        digits = re.sub(r"\D", "", job_id)
        return 15000 + int(digits[-4:]) if digits else 12910

    @staticmethod
    @override
    def detect(env: Mapping[str, str] | None = None) -> bool:
        env = os.environ if env is None else env
        return "SLURM_NTASKS" in env and not _slurm_interactive(env)

    @override
    def world_size(self) -> int:
        return self._int("SLURM_NTASKS")

    @override
    def set_world_size(self, size: int) -> None:
        pass  # SLURM decides

    @override
    def global_rank(self) -> int:
        return self._int("SLURM_PROCID")

    @override
    def set_global_rank(self, rank: int) -> None:
        pass  # SLURM decides

    @override
    def local_rank(self) -> int:
        return self._int("SLURM_LOCALID")

    @override
    def node_rank(self) -> int:
        return self._int("SLURM_NODEID", 0)

    def tasks_per_node(self) -> int | None:
        """Tasks on each node, from ``SLURM_NTASKS_PER_NODE`` or a uniform ``SLURM_TASKS_PER_NODE``."""
        if "SLURM_NTASKS_PER_NODE" in self._env:
            return self._int("SLURM_NTASKS_PER_NODE")
        spec = self._env.get("SLURM_TASKS_PER_NODE")  # e.g. "2(x3)" or "2,1"
        if spec:
            counts = {int(m) for m in re.findall(r"(\d+)(?:\(x\d+\))?", spec)}
            if len(counts) == 1:
                return counts.pop()
        return None

    @override
    def validate_settings(self, num_devices: int, num_nodes: int) -> None:
        per_node = self.tasks_per_node()
        if per_node is not None and per_node != num_devices:
            raise ValueError(
                f"Fabric(devices={num_devices}) does not match SLURM's {per_node} tasks per node"
                f" (--ntasks-per-node={per_node}). Set devices={per_node}, or ask SLURM for"
                f" --ntasks-per-node={num_devices}."
            )
        if "SLURM_NNODES" in self._env and self._int("SLURM_NNODES") != num_nodes:
            nnodes = self._int("SLURM_NNODES")
            raise ValueError(
                f"Fabric(num_nodes={num_nodes}) does not match SLURM's --nodes={nnodes} (SLURM_NNODES)."
                f" Set num_nodes={nnodes}, or ask SLURM for --nodes={num_nodes}."
            )
        ntasks = self.world_size()
        if ntasks != num_devices * num_nodes:
            raise ValueError(
                f"Fabric(devices={num_devices}, num_nodes={num_nodes}) asks for {num_devices * num_nodes} processes,"
                f" but SLURM started {ntasks} tasks (SLURM_NTASKS). Start the script with"
                f" `srun --ntasks-per-node={num_devices} --nodes={num_nodes}`, or change devices/num_nodes."
            )
