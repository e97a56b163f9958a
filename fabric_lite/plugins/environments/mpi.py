"""The environment of processes started by an MPI launcher (``mpirun``/``mpiexec``), through ``mpi4py``."""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Mapping
from typing import Any

from typing_extensions import override

from fabric_lite.plugins.environments.cluster_environment import _LauncherEnvironment
from fabric_lite.utilities.imports import _Availability

#: variables that MPI launchers set in the processes they start (Open MPI, MPICH/Hydra and Intel MPI, PMIx,
#: MVAPICH); without one of them this process was not started by an MPI launcher and mpi4py is never imported
_LAUNCHER_VARIABLES = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "MV2_COMM_WORLD_SIZE", "MPI_LOCALNRANKS")
#: variables that hold the world size itself: "1" means a single process, with no need to ask MPI
_SIZE_VARIABLES = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "MV2_COMM_WORLD_SIZE")
#: whether mpi4py is installed (Lightning's name; checked on first use, without importing it)
_MPI4PY_AVAILABLE = _Availability("mpi4py")
_INSTALL_HINT = "Install it with `pip install mpi4py` (or `pip install fabric_lite[mpi]`); it needs an MPI library."


def _import_mpi() -> Any:
    """``mpi4py.MPI`` (importing it initialises MPI), or ``ModuleNotFoundError`` saying how to install it."""
    error: ModuleNotFoundError | None = None
    if _MPI4PY_AVAILABLE:
        try:
            from mpi4py import MPI  # type: ignore[import-not-found,unused-ignore]

            return MPI
        except ModuleNotFoundError as err:
            if err.name not in ("mpi4py", "mpi4py.MPI"):
                raise
            error = err
    raise ModuleNotFoundError(
        f"MPIEnvironment needs the mpi4py package, which is not installed. {_INSTALL_HINT}"
    ) from error


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("", 0))
        return int(sock.getsockname()[1])


class MPIEnvironment(_LauncherEnvironment):
    """Processes started by ``mpirun``/``mpiexec``, with ranks from MPI's ``COMM_WORLD`` (through ``mpi4py``).

    The node rank is this host's index among the ranks' sorted host names; rank 0 broadcasts its host name and a free
    port for the process group (gloo or NCCL: MPI only tells the ranks). An answer that needs MPI is a collective the
    first time it is asked (then kept), so every rank must ask for it.

    Raises:
        ModuleNotFoundError: mpi4py is not installed (the message says how to install it).

    Example::

        fabric = Fabric(accelerator="cpu", devices="auto")  # under `mpirun -np 4`: 4 processes on this node
    """

    def __init__(self, env: Mapping[str, str] | None = None) -> None:
        super().__init__(env)
        self._comm_world = _import_mpi().COMM_WORLD
        self._comm_local: Any = None
        self._node_rank: int | None = None
        self._num_nodes: int | None = None
        self._main_address: str | None = None
        self._main_port: int | None = None

    def _main(self) -> tuple[str, int]:
        if self._main_address is None or self._main_port is None:
            # one broadcast for both, so that asking for either first is the same collective on every rank
            mine = (socket.gethostname(), _free_port()) if self._comm_world.Get_rank() == 0 else None
            address, port = self._comm_world.bcast(mine, root=0)
            self._main_address, self._main_port = str(address), int(port)
        return self._main_address, self._main_port

    @property
    @override
    def main_address(self) -> str:
        """Rank 0's host name (broadcast from rank 0 with the port: a collective the first time)."""
        return self._main()[0]

    @property
    @override
    def main_port(self) -> int:
        """A port that was free on rank 0 (broadcast from rank 0 with the address: a collective the first time)."""
        return self._main()[1]

    @staticmethod
    @override
    def detect(env: Mapping[str, str] | None = None) -> bool:
        """Whether an MPI launcher started this process among others (``COMM_WORLD`` holds several). mpi4py is asked
        only where the program imported it or a launcher's variable is set, so that a plain run never starts MPI."""
        env = os.environ if env is None else env
        imported = sys.modules.get("mpi4py.MPI") or getattr(sys.modules.get("mpi4py"), "MPI", None)
        if imported is not None:  # MPI initialised by the program: ask it, whatever launched this process
            return bool(_MPI4PY_AVAILABLE) and int(imported.COMM_WORLD.Get_size()) > 1
        if not any(name in env for name in _LAUNCHER_VARIABLES):
            return False
        sizes = [env[name] for name in _SIZE_VARIABLES if name in env]
        if sizes and all(size.strip() == "1" for size in sizes):
            return False
        try:
            from mpi4py import MPI
        except ImportError:  # not installed, or installed without a working MPI library
            return False
        return int(MPI.COMM_WORLD.Get_size()) > 1

    @override
    def world_size(self) -> int:
        return int(self._comm_world.Get_size())

    @override
    def global_rank(self) -> int:
        return int(self._comm_world.Get_rank())

    def _init_comm_local(self) -> None:
        # rank 0 sorts the distinct host names and sends them to every rank: the same node index for the same host
        hostname = socket.gethostname()
        hosts = self._comm_world.gather(hostname, root=0)  # None on the other ranks
        nodes = self._comm_world.bcast(sorted(set(hosts)) if hosts is not None else None, root=0)
        self._num_nodes = len(nodes)
        self._node_rank = nodes.index(hostname)
        self._comm_local = self._comm_world.Split(color=self._node_rank, key=self._comm_world.Get_rank())

    @override
    def local_rank(self) -> int:
        """The rank among the processes on this node (a collective the first time)."""
        if self._comm_local is None:
            self._init_comm_local()
        return int(self._comm_local.Get_rank())

    @override
    def node_rank(self) -> int:
        """The index of this host among the job's sorted host names (a collective the first time)."""
        if self._node_rank is None:
            self._init_comm_local()
        return int(self._node_rank)  # type: ignore[arg-type]

    def local_world_size(self) -> int:
        """How many processes the launcher started on this node (a collective the first time)."""
        if self._comm_local is None:
            self._init_comm_local()
        return int(self._comm_local.Get_size())

    def num_nodes(self) -> int:
        """How many distinct hosts the job's processes run on (a collective the first time)."""
        if self._num_nodes is None:
            self._init_comm_local()
        return int(self._num_nodes)  # type: ignore[arg-type]

    @override
    def validate_settings(self, num_devices: int, num_nodes: int) -> None:
        """``devices`` and ``num_nodes`` must describe the processes that the MPI launcher started."""
        world_size, local, nodes = self.world_size(), self.local_world_size(), self.num_nodes()
        if num_devices != local or num_nodes != nodes or num_devices * num_nodes != world_size:
            raise ValueError(
                f"Fabric(devices={num_devices}, num_nodes={num_nodes}) does not match the MPI job: {world_size}"
                f" processes on {nodes} node(s), {local} on this one. Set devices={local}, num_nodes={nodes}"
                " (or leave devices='auto'), or start mpirun with the matching number of processes."
            )
