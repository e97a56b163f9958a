"""The ``ddp_spawn``/``ddp_fork`` launcher: ``fabric.launch(fn)`` runs ``fn`` in one new process per device."""

from __future__ import annotations

import contextlib
import multiprocessing
import multiprocessing.connection
import os
import pickle
import shutil
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from typing_extensions import override

from fabric_lite.strategies.launchers.launcher import ForwardSignals, Launcher, die_with_parent, is_secondary
from fabric_lite.strategies.launchers.subprocess_script import threads_per_process
from fabric_lite.utilities import _trail
from fabric_lite.utilities._hang_report import (
    BLOCK_START,
    collect,
    find_block,
    how_it_ended,
    print_report,
    signal_name,
    wait_for_reporter,
)

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

    Example::

        def train(fabric):
            return fabric.all_reduce(torch.tensor(1.0), reduce_op="sum").item()

        if __name__ == "__main__":
            fabric = Fabric(accelerator="cpu", devices=2, strategy="ddp_spawn")
            print(fabric.launch(train))  # 2.0: rank 0's result
    """

    requires_function = True

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
                ' Fabric and calls launch() runs at import time. Put it under `if __name__ == "__main__":` so'
                " that spawned processes can import the script without launching again."
            )
        if self._start_method == "fork" and torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
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
        context = mp.get_context(self._start_method)
        results = context.SimpleQueue()  # rank 0's return value; read while joining, so a large one cannot block
        # the ranks' trails of collectives, read here when a rank dies (the workers get the strategy, and so the
        # folder, with their arguments); removed after the job
        run_dir = _trail.make_run_dir()
        strategy._run_dir, strategy._launcher_kind = run_dir, "spawn"
        try:
            processes = mp.start_processes(  # type: ignore[attr-defined,no-untyped-call]
                _worker,
                args=(strategy, function, args, kwargs, environment.main_address, port, results, os.getpid()),
                nprocs=strategy.num_processes,
                start_method=self._start_method,
                join=False,
            )
            received: list[Any] = []
            first_rank = strategy.node_rank * strategy.num_processes
            _supervise(processes, results, received, run_dir=run_dir, first_rank=first_rank, world=strategy.world_size)
            if not received:
                return None  # global rank 0 runs on another node
            return pickle.loads(received[0])
        finally:
            results.close()
            del store
            strategy._run_dir = strategy._launcher_kind = None
            shutil.rmtree(run_dir, ignore_errors=True)


def _supervise(
    processes: Any,
    results: Any,
    received: list[Any],
    window: float = 1.0,
    grace: float = 3.0,
    run_dir: str | None = None,
    first_rank: int = 0,
    world: int | None = None,
) -> None:
    """Wait for the workers, reading rank 0's result as it comes; on a failure, end the job with its root cause.

    ``torch.multiprocessing`` would report whichever failed worker it noticed first, often a rank that only lost
    its peer ("Connection closed by peer"). Here, as in the script launcher, a failure that only reports a lost peer
    waits up to ``window`` seconds for the worker that really failed. Before the others are stopped, where every
    rank was is reported from the trails in ``run_dir`` (unless a rank reported it already); ``first_rank`` is the
    global rank of the first worker, ``world`` the number of ranks.
    """
    workers = processes.processes
    error_files = processes.error_files

    def pass_on(signum: int) -> None:  # SIGTERM/SIGINT to the launching process: tell every worker, then end them
        for worker in workers:
            if worker.is_alive() and worker.pid is not None:
                os.kill(worker.pid, signum)
        deadline = time.monotonic() + grace  # a grace period to act on the signal (e.g. save a checkpoint)
        for worker in workers:
            worker.join(max(0.0, deadline - time.monotonic()))
        _stop(workers, 1.0)

    def drain() -> None:
        if not received and not results.empty():
            received.append(results.get())

    def trace(index: int) -> str | None:
        try:
            with open(error_files[index], "rb") as f:
                return str(pickle.load(f))
        except (OSError, EOFError, pickle.UnpicklingError):
            return None

    first_failure: float | None = None
    root: int | None = None
    signals = ForwardSignals(pass_on)
    signals.install()
    try:
        while True:
            drain()
            failed = [i for i, w in enumerate(workers) if w.exitcode not in (None, 0)]
            if failed and first_failure is None:
                first_failure = time.monotonic()
            primary = [i for i in failed if not is_secondary(trace(i) or "")]
            if primary or (failed and time.monotonic() - first_failure >= window):  # type: ignore[operator]
                root = (primary or failed)[0]
                early = [i for i, w in enumerate(workers) if w.exitcode == 0]
                if not primary and early:
                    # the others lost a peer that had returned early: that worker is the cause
                    _stop(workers, grace)
                    raise mp.ProcessExitedException(  # type: ignore[attr-defined]
                        f"process {early[0]} exited with code 0 while the other processes were still running: they"
                        " then lost their peer in a collective. Every process must run the same collectives; none may"
                        " return early.",
                        early[0],
                        workers[early[0]].pid,
                        0,
                    )
                break
            if all(w.exitcode == 0 for w in workers):
                drain()
                return
            multiprocessing.connection.wait([w.sentinel for w in workers if w.exitcode is None] or [], 0.05)
        if run_dir is not None:
            _report(run_dir, workers, root, first_rank, world)
            wait_for_reporter(run_dir, {w.pid: w.join for w in workers if w.pid is not None and w.exitcode is None})
        _stop(workers, grace)
        failed_worker = workers[root]
        text = trace(root)
        if run_dir is not None and (text is None or BLOCK_START not in text):
            # ranks that timed out together: the one that reported is not always the one reported as the cause
            blocks = [find_block(trace(i) or "") for i in range(len(workers))]
            block = next((b for b in blocks if b), None)
            if block:
                print(block, file=sys.stderr, flush=True)
        if text is not None:
            raise mp.ProcessRaisedException(  # type: ignore[attr-defined]
                f"\n\n-- Process {root} terminated with the following error:\n{text}", root, failed_worker.pid
            )
        code = failed_worker.exitcode
        if code < 0:
            name = signal_name(code) or f"signal {-code}"
            raise mp.ProcessExitedException(  # type: ignore[attr-defined]
                f"process {root} terminated with signal {name}", root, failed_worker.pid, code, name
            )
        raise mp.ProcessExitedException(  # type: ignore[attr-defined]
            f"process {root} terminated with exit code {code}", root, failed_worker.pid, code
        )
    finally:
        signals.restore()
        for path in error_files:
            with contextlib.suppress(OSError):
                os.unlink(path)


def _report(run_dir: str, workers: list[Any], root: int, first_rank: int, world: int | None) -> None:
    """Print where every rank was when worker ``root`` ended (the hang report), unless a rank printed it already."""
    print_report(
        lambda: collect(
            run_dir,
            reason=f"rank {first_rank + root} {how_it_ended(workers[root].exitcode)}",
            exit_codes={first_rank + i: w.exitcode for i, w in enumerate(workers) if w.exitcode is not None},
            pids={first_rank + i: w.pid for i, w in enumerate(workers) if w.pid is not None},
            world_size=world,
        ),
        lambda block: print(block, file=sys.stderr, flush=True),
    )


def _stop(workers: list[Any], grace: float) -> None:
    """SIGTERM every live worker, wait up to ``grace`` seconds, then SIGKILL what is left."""
    for worker in workers:
        if worker.is_alive():
            worker.terminate()
    deadline = time.monotonic() + grace
    for worker in workers:
        worker.join(max(0.0, deadline - time.monotonic()))
        if worker.is_alive():
            worker.kill()
            worker.join()


def _worker(
    process_index: int,
    strategy: ParallelStrategy,
    function: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    address: str,
    port: int,
    results: Any,
    parent_pid: int,
) -> None:
    die_with_parent(parent_pid)
    if "OMP_NUM_THREADS" not in os.environ:
        torch.set_num_threads(threads_per_process(strategy.num_processes))
    strategy._local_rank = process_index
    if strategy._run_dir is not None:  # so that any other Fabric of this process records in the same run folder
        os.environ[_trail.ENV_RUN_DIR], os.environ[_trail.ENV_LAUNCHER] = strategy._run_dir, "spawn"
    strategy._set_world_ranks()
    strategy._store = dist.TCPStore(  # type: ignore[attr-defined]
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
            results.put(payload)
    finally:
        strategy.teardown()
