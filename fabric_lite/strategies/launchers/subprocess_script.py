"""The ``ddp`` launcher: the script is run again once per extra local rank, like ``torch.distributed.run``."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from typing_extensions import override

from fabric_lite.strategies.launchers._supervisor import Child, ProcessSupervisor, record_child_errors
from fabric_lite.strategies.launchers.launcher import CHILD_SHIM, ENV_ERROR_FD, ENV_PARENT_PID, Launcher
from fabric_lite.utilities import _trail
from fabric_lite.utilities.data import _num_cpus_available

if TYPE_CHECKING:
    from fabric_lite.strategies.parallel import ParallelStrategy


def script_command() -> list[str]:
    """The command line that started this interpreter: the same script or ``-m`` module, flags and arguments."""
    import __main__

    interpreter = [sys.executable, *subprocess._args_from_interpreter_flags()]  # type: ignore[attr-defined]
    spec = getattr(__main__, "__spec__", None)
    if spec is None:
        return [*interpreter, os.path.abspath(sys.argv[0]), *sys.argv[1:]]
    return [*interpreter, "-m", spec.name, *sys.argv[1:]]


def threads_per_process(num_processes: int) -> int:
    """CPU threads for each of ``num_processes`` processes on this node, so that they do not oversubscribe."""
    return max(1, _num_cpus_available() // max(1, num_processes))


class SubprocessScriptLauncher(Launcher):
    """Start local ranks ``1..N-1`` by running this script again, then run the function in this process.

    The process the user started is local rank 0. On the main node it holds the rendezvous store on
    ``MASTER_PORT`` (a free port when unset: the port is bound before any child starts, so concurrent jobs never
    race for it). Each child gets ``MASTER_ADDR``, ``MASTER_PORT``, ``NODE_RANK``, ``LOCAL_RANK`` and
    ``WORLD_SIZE`` in its environment and, like torchrun's workers, sees the same script and arguments.

    Children are supervised (see :mod:`fabric_lite.strategies.launchers._supervisor`): the first failure ends the
    whole job with that rank's traceback as the reported root cause, and no child outlives rank 0.

    The function's return value is returned in every process (each process returns its own).

    Example::

        fabric = Fabric(accelerator="cpu", devices=2, strategy="ddp")
        fabric.launch()  # the script runs once more, with LOCAL_RANK=1; both continue from here
    """

    def __init__(self, strategy: ParallelStrategy) -> None:
        self._strategy = strategy
        self.children: list[Child] = []
        self.supervisor: ProcessSupervisor | None = None

    @override
    def launch(self, function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        environment = self._strategy.cluster_environment
        if environment.creates_processes_externally:
            error_fd = os.environ.get(ENV_ERROR_FD)
            if error_fd and error_fd.isdigit():
                # a child of this launcher: report an unhandled exception to rank 0 through the inherited pipe
                record_child_errors(int(error_fd))
            return function(*args, **kwargs)
        self._start_children()
        try:
            return function(*args, **kwargs)
        finally:
            if self.supervisor is not None:
                # now that the process group exists, so that rank 0's exit handler runs before its teardown
                self.supervisor.arm_exit_handler()

    def _start_children(self) -> None:
        if self.children:
            raise RuntimeError("This launcher has already started its processes; call fabric.launch() once.")
        strategy = self._strategy
        environment = strategy.cluster_environment
        num_processes = strategy.num_processes
        strategy._set_world_ranks()
        port = environment.main_port
        if strategy.node_rank == 0:
            # hold the port for the whole job: the children connect to this store
            store = strategy._create_store(is_master=True)
            strategy._store = store
            port = store.port
        if num_processes <= 1:
            return
        threads = None
        if "OMP_NUM_THREADS" not in os.environ:
            threads = threads_per_process(num_processes)
            torch.set_num_threads(threads)
        command = [sys.executable, "-c", CHILD_SHIM, *script_command()]
        # the ranks' trails of collectives, read by the supervisor when a rank dies (removed after the job)
        run_dir = _trail.make_run_dir()
        strategy._run_dir, strategy._launcher_kind = run_dir, "script"
        for local_rank in range(1, num_processes):
            env = dict(os.environ)
            env.update(
                MASTER_ADDR=environment.main_address,
                MASTER_PORT=str(port),
                NODE_RANK=str(strategy.node_rank),
                LOCAL_RANK=str(local_rank),
                WORLD_SIZE=str(strategy.world_size),
            )
            env[_trail.ENV_RUN_DIR], env[_trail.ENV_LAUNCHER] = run_dir, "script"
            if threads is not None:
                env["OMP_NUM_THREADS"] = str(threads)
            read_fd, write_fd = os.pipe()
            env[ENV_PARENT_PID] = str(os.getpid())
            env[ENV_ERROR_FD] = str(write_fd)
            try:
                process = subprocess.Popen(command, env=env, pass_fds=(write_fd,))
            finally:
                os.close(write_fd)
            os.set_blocking(read_fd, False)
            global_rank = strategy.node_rank * num_processes + local_rank
            self.children.append(Child(global_rank, local_rank, process, read_fd))
        self.supervisor = ProcessSupervisor(
            self.children, teardown=strategy._destroy_process_group, run_dir=run_dir, world_size=strategy.world_size
        )
        self.supervisor.start()


#: Lightning Fabric's name for the class (an ``isinstance`` check written for Lightning finds this launcher); its
#: constructor takes the strategy, not Lightning's (cluster environment, processes, nodes)
_SubprocessScriptLauncher = SubprocessScriptLauncher
