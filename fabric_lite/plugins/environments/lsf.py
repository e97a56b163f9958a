"""The environment of processes started by LSF's job step manager (``jsrun``)."""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping

from typing_extensions import override

from fabric_lite.plugins.environments.cluster_environment import _LauncherEnvironment

_REQUIRED = ("LSB_JOBID", "LSB_DJOB_RANKFILE", "JSM_NAMESPACE_LOCAL_RANK", "JSM_NAMESPACE_SIZE")


class LSFEnvironment(_LauncherEnvironment):
    """Processes started by ``jsrun`` in an LSF job; fabric_lite starts none.

    Ranks come from ``JSM_NAMESPACE_RANK``, ``JSM_NAMESPACE_LOCAL_RANK`` and ``JSM_NAMESPACE_SIZE``. The compute hosts
    are the rank file's (``LSB_DJOB_RANKFILE``, else ``LSB_HOSTS``) after the first entry, the launch node: the main
    address is the first, the node rank this host's position among the distinct ones. The port is ``MASTER_PORT``,
    else ``10000 + LSB_JOBID % 1000``, the same in every task. Hosts and port are read when it is created.

    Raises:
        ValueError: no host list, or neither ``MASTER_PORT`` nor ``LSB_JOBID`` to derive the port from.

    Example::

        fabric = Fabric(accelerator="cuda", devices=2, num_nodes=2)  # under `jsrun -n 4 -r 2`: detected
    """

    _WORLD_SIZE, _GLOBAL_RANK, _LOCAL_RANK = "JSM_NAMESPACE_SIZE", "JSM_NAMESPACE_RANK", "JSM_NAMESPACE_LOCAL_RANK"

    def __init__(self, env: Mapping[str, str] | None = None) -> None:
        super().__init__(env)
        self._hosts = self._read_hosts()
        self._main_address = self._hosts[0]
        self._main_port = self._get_main_port()
        self._node_rank: int | None = None

    def _read_hosts(self) -> list[str]:
        """The compute hosts of the job, one entry per task slot, without the launch node."""
        rankfile = self._env.get("LSB_DJOB_RANKFILE")
        if rankfile is not None:
            if not rankfile:
                raise ValueError("The environment variable `LSB_DJOB_RANKFILE` is empty: LSF names no rank file.")
            try:
                with open(rankfile) as handle:
                    entries = [line.strip() for line in handle]
            except OSError as error:
                raise ValueError(
                    f"Cannot read the LSF rank file LSB_DJOB_RANKFILE={rankfile!r}: {error}. Run the script with"
                    " jsrun inside an LSF job."
                ) from None
            source = f"LSB_DJOB_RANKFILE={rankfile!r}"
        elif self._env.get("LSB_HOSTS", "").strip():
            entries = self._env["LSB_HOSTS"].split()
            source = "LSB_HOSTS"
        else:
            raise ValueError(
                "Did not find the environment variable `LSB_DJOB_RANKFILE` (nor `LSB_HOSTS`): LSFEnvironment needs"
                " the job's hosts. Run the script with jsrun inside an LSF job."
            )
        hosts = entries[1:]  # the first entry is the launch node
        if not hosts:
            raise ValueError(f"{source} lists no compute host after the launch node ({entries[:1]}).")
        return hosts

    def _get_main_port(self) -> int:
        if "MASTER_PORT" in self._env:
            return self._int("MASTER_PORT")
        if "LSB_JOBID" in self._env:
            return self._int("LSB_JOBID") % 1000 + 10000  # every task derives the same port in the 10k+ range
        raise ValueError("Could not find job id in environment variable LSB_JOBID, nor MASTER_PORT: set one of them.")

    @property
    @override
    def main_address(self) -> str:
        return self._main_address

    @property
    @override
    def main_port(self) -> int:
        return self._main_port

    @staticmethod
    @override
    def detect(env: Mapping[str, str] | None = None) -> bool:
        """Whether ``jsrun`` started this process: every one of its variables and LSF's job variables is set."""
        env = os.environ if env is None else env
        return all(name in env for name in _REQUIRED)

    @override
    def node_rank(self) -> int:
        """This host's position among the job's distinct compute hosts; ``RuntimeError`` where it is not one."""
        if self._node_rank is None:
            self._node_rank = self._get_node_rank()
        return self._node_rank

    def _get_node_rank(self) -> int:
        """This host's position among the distinct compute hosts, in order of appearance (Lightning's name)."""
        distinct = list(dict.fromkeys(self._hosts))
        hostname = socket.gethostname()
        if hostname not in distinct:
            raise RuntimeError(
                f"This machine's host name {hostname!r} is not among the LSF job's compute hosts {distinct};"
                " cannot tell its node rank. Run the script with jsrun inside the job."
            )
        return distinct.index(hostname)
