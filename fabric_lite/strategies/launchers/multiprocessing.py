"""The ``ddp_spawn``/``ddp_fork`` launcher: ``fabric.launch(fn)`` runs ``fn`` in one new process per device."""

from __future__ import annotations

import multiprocessing
import os
import pickle
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from typing_extensions import override

from fabric_lite.strategies.launchers.launcher import Launcher, die_with_parent
from fabric_lite.strategies.launchers.subprocess_script import threads_per_process

if TYPE_CHECKING:
    from fabric_lite.strategies.parallel import ParallelStrategy


class MultiProcessingLauncher(Launcher):
    """Start one process per local device with ``torch.multiprocessing`` and run the function in each.

    The launching process is not a rank: it holds the rendezvous store (so the port cannot be taken by anyone
    else), waits for the workers and returns what the function returned in global rank 0. When a worker fails,
    ``torch.multiprocessing`` stops the others and raises in the launching process with the worker's traceback.

    Args:
        strategy: the strategy whose processes to start.
        start_method: ``"spawn"`` (a fresh interpreter: the function and its arguments must be picklable and the
            script must guard its top level with ``if __name__ == "__main__":``), ``"fork"`` or ``"forkserver"``.
    """

    def __init__(self, strategy: ParallelStrategy, start_method: str = "spawn") -> None:
        self._strategy = strategy
        self._start_method = start_method

    @property
    @override
    def is_interactive_compatible(self) -> bool:
        return self._start_method == "fork"

    @override
    def launch(self, function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        if getattr(multiprocessing.current_process(), "_inheriting", False):
            raise RuntimeError(
                "fabric.launch() was called while a new process was importing your script: the code that creates"
                " Fabric and calls launch() runs at import time. Put it under `if __name__ == \"__main__\":` so"
                " that spawned processes can import the script without launching again."
            )
        if self._start_method == "fork" and torch.cuda.is_initialized():
            raise RuntimeError(
                "Cannot fork processes after CUDA has been initialised in this process (CUDA does not survive a"
                " fork). Use strategy='ddp_spawn', or do not touch CUDA before fabric.launch()."
            )
        strategy = self._strategy
        environment = strategy.cluster_environment
        strategy._set_world_ranks()
        store = None
        port = environment.main_port
        if strategy.node_rank == 0:
            store = strategy._create_store(is_master=True)  # held here for the whole job
            port = store.port
        result_dir = tempfile.mkdtemp(prefix="fabric_lite_spawn_")
        try:
            mp.start_processes(
                _worker,
                args=(strategy, function, args, kwargs, environment.main_address, port, result_dir, os.getpid()),
                nprocs=strategy.num_processes,
                start_method=self._start_method,
            )
            result_file = Path(result_dir) / "result.pkl"
            if not result_file.is_file():
                return None  # global rank 0 runs on another node
            with open(result_file, "rb") as f:
                return pickle.load(f)
        finally:
            shutil.rmtree(result_dir, ignore_errors=True)
            del store


def _worker(
    process_index: int,
    strategy: ParallelStrategy,
    function: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    address: str,
    port: int,
    result_dir: str,
    parent_pid: int,
) -> None:
    die_with_parent(parent_pid)
    if "OMP_NUM_THREADS" not in os.environ:
        torch.set_num_threads(threads_per_process(strategy.num_processes))
    strategy._local_rank = process_index
    strategy._set_world_ranks()
    strategy._store = dist.TCPStore(
        address, port, world_size=strategy.world_size, is_master=False, timeout=strategy.timeout
    )
    try:
        result = function(*args, **kwargs)
        if strategy.global_rank == 0:
            try:
                payload = pickle.dumps(result)
            except Exception as err:
                raise RuntimeError(
                    f"The function passed to fabric.launch() returned a {type(result).__name__} that cannot be sent"
                    f" back to the launching process ({err}). Return something picklable (e.g. numbers, tensors,"
                    " a state dict), or nothing."
                ) from err
            (Path(result_dir) / "result.pkl").write_bytes(payload)
    finally:
        strategy.teardown()
