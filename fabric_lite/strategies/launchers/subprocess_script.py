"""The ``ddp`` launcher: the script is run again once per extra local rank, like ``torch.distributed.run``."""

from __future__ import annotations

import atexit
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from typing_extensions import override

from fabric_lite.runtime import rendezvous
from fabric_lite.runtime.diagnostics import trail as _trail
from fabric_lite.runtime.run import RunContext
from fabric_lite.strategies.launchers._supervisor import Child, ProcessSupervisor, record_child_errors
from fabric_lite.strategies.launchers.launcher import CHILD_SHIM, ENV_ERROR_FD, ENV_PARENT_PID, Launcher
from fabric_lite.utilities.distributed import _set_num_threads_if_needed

if TYPE_CHECKING:
    from fabric_lite.strategies.parallel import ParallelStrategy


@dataclass(frozen=True)
class _Job:
    """The job this process started as local rank 0: what a later ``Fabric`` in the process joins."""

    num_processes: int
    world_size: int
    node_rank: int
    run: RunContext
    children: list[Child]
    supervisor: ProcessSupervisor | None


#: the job this process launched, if any: a second ``Fabric`` in the script joins it, as the same line does in the
#: children (starting the script again would leave a child waiting on a rendezvous no other rank joins)
_launched: _Job | None = None


def script_command() -> list[str]:
    """The command line that started this interpreter: the same script or ``-m`` module, flags and arguments."""
    import __main__

    interpreter = [sys.executable, *subprocess._args_from_interpreter_flags()]  # type: ignore[attr-defined]
    spec = getattr(__main__, "__spec__", None)
    if spec is None:
        return [*interpreter, os.path.abspath(sys.argv[0]), *sys.argv[1:]]
    return [*interpreter, "-m", spec.name, *sys.argv[1:]]


class SubprocessScriptLauncher(Launcher):
    """Start local ranks ``1..N-1`` by running this script again, with ``MASTER_ADDR``, ``MASTER_PORT``,
    ``NODE_RANK``, ``LOCAL_RANK`` and ``WORLD_SIZE`` set as torchrun does, then run the function in this process
    (local rank 0, which holds the rendezvous store on the main node); every process returns its own result.

    The first failure ends the whole job with that rank's traceback as the root cause
    (:mod:`~fabric_lite.strategies.launchers._supervisor`), and no child outlives rank 0. A later ``Fabric`` in the
    script with the same ``devices`` and ``num_nodes`` joins the processes already running.

    Example::

        Fabric(accelerator="cpu", devices=2, strategy="ddp").launch()  # the script runs once more, as LOCAL_RANK=1
    """

    def __init__(self, strategy: ParallelStrategy) -> None:
        self._strategy = strategy
        self.children: list[Child] = []
        self.supervisor: ProcessSupervisor | None = None

    @override
    def launch(self, function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        if self._strategy.cluster_environment.creates_processes_externally:
            error_fd = os.environ.get(ENV_ERROR_FD)
            if error_fd and error_fd.isdigit():
                # a child of this launcher: report an unhandled exception to rank 0 through the inherited pipe
                record_child_errors(int(error_fd))
            return function(*args, **kwargs)
        if _launched is not None:
            self._join(_launched)
            return function(*args, **kwargs)
        self._start_children()
        try:
            return function(*args, **kwargs)
        finally:
            if self.supervisor is not None:
                # registered now that the process group exists: exit handlers run last-registered first, so rank 0
                # waits for its children before the process group's own handler tears it down
                atexit.register(self.supervisor.wait_at_exit)

    def _join(self, job: _Job) -> None:
        """Take part in the job this process launched before, with its rendezvous store and its children."""
        strategy = self._strategy
        strategy._set_world_ranks()
        shape = (strategy.num_processes, strategy.world_size, strategy.node_rank)
        if shape != (job.num_processes, job.world_size, job.node_rank):
            raise RuntimeError(
                f"This process launched a job of {job.num_processes} process(es) per node, {job.world_size} in all"
                f" (node rank {job.node_rank}), and a later Fabric in it asks for {strategy.num_processes} per node,"
                f" {strategy.world_size} in all (node rank {strategy.node_rank}). A Fabric made after the first launch"
                " joins the running processes: give it the same devices and num_nodes, or run the other"
                " configuration as a script of its own."
            )
        strategy.attach_run(job.run)
        self.children, self.supervisor = job.children, job.supervisor

    def _start_children(self) -> None:
        global _launched
        if self.children:
            raise RuntimeError(
                "The launcher can only create subprocesses once: this one has started its processes already. Call"
                " fabric.launch() once."
            )
        strategy = self._strategy
        environment = strategy.cluster_environment
        if environment.local_rank() > 0:
            name = type(environment).__name__
            raise RuntimeError(
                f"fabric.launch() attempted to launch new distributed processes with `local_rank > 0` (local rank"
                f" {environment.local_rank()} from {name}): only local rank 0 starts the others. Either LOCAL_RANK"
                f" was changed, or {name}.creates_processes_externally should be True (another launcher started the"
                " processes)."
            )
        num_processes = strategy.num_processes
        strategy._set_world_ranks()
        port = environment.main_port
        run = RunContext()
        if strategy.node_rank == 0:
            # hold the port for the whole job: the children connect to this store
            store = rendezvous.create_store(environment, 0, strategy.world_size, strategy.timeout, is_master=True)
            run = replace(run, store=store)
            port = run.store.port
        if num_processes <= 1:
            strategy.attach_run(run)
            if strategy.world_size > 1:  # one process per node: the other nodes reach this store
                _launched = _Job(num_processes, strategy.world_size, strategy.node_rank, run, [], None)
            return
        _set_num_threads_if_needed(num_processes)  # here, and through the environment in the children
        command = [sys.executable, "-c", CHILD_SHIM, *script_command()]
        # the ranks' trails of collectives, read by the supervisor when a rank dies (removed after the job)
        run = replace(run, launcher="script", run_dir=_trail.make_run_dir())
        strategy.attach_run(run)
        for local_rank in range(1, num_processes):
            env = dict(os.environ)
            env.update(
                MASTER_ADDR=environment.main_address,
                MASTER_PORT=str(port),
                NODE_RANK=str(strategy.node_rank),
                LOCAL_RANK=str(local_rank),
                WORLD_SIZE=str(strategy.world_size),
            )
            env.update(run.environment())
            read_fd, write_fd = os.pipe()
            env[ENV_PARENT_PID] = str(os.getpid())
            env[ENV_ERROR_FD] = str(write_fd)
            try:
                process = subprocess.Popen(command, env=env, pass_fds=(write_fd,))
            finally:
                os.close(write_fd)
            os.set_blocking(read_fd, False)
            self.children.append(Child(strategy.node_rank * num_processes + local_rank, local_rank, process, read_fd))
        self.supervisor = ProcessSupervisor(
            self.children, teardown=strategy._destroy_process_group, run_dir=run.run_dir, world_size=strategy.world_size
        )
        self.supervisor.start()
        _launched = _Job(num_processes, strategy.world_size, strategy.node_rank, run, self.children, self.supervisor)


#: Lightning's name of the launcher (Lightning's is built from the environment and sizes; this one from the strategy)
_SubprocessScriptLauncher = SubprocessScriptLauncher
