"""The ``ddp_spawn``/``ddp_fork`` launcher: ``fabric.launch(fn)`` runs ``fn`` in one new process per device."""

from __future__ import annotations

import contextlib
import itertools
import multiprocessing
import multiprocessing.connection
import os
import pickle
import shutil
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn import Module
from typing_extensions import override

from fabric_lite.runtime import rendezvous
from fabric_lite.runtime.diagnostics import trail as _trail
from fabric_lite.runtime.diagnostics.hang_report import BLOCK_START, find_block
from fabric_lite.runtime.run import RunContext
from fabric_lite.runtime.supervision import RootCause, how_it_ended, signal_name
from fabric_lite.strategies.launchers._supervisor import forward_signal, report, stop, to_stderr, watch
from fabric_lite.strategies.launchers.launcher import ForwardSignals, Launcher, die_with_launcher
from fabric_lite.utilities._tree import flatten
from fabric_lite.utilities.distributed import _set_num_threads_if_needed
from fabric_lite.utilities.imports import _IS_INTERACTIVE
from fabric_lite.utilities.seed import _collect_rng_states, _set_rng_states

if TYPE_CHECKING:
    from fabric_lite.strategies.parallel import ParallelStrategy

#: how long a failure that only says a peer went away waits for the root cause, and a stopped worker for its exit
_WINDOW_S, _GRACE_S = 1.0, 3.0


class MultiProcessingLauncher(Launcher):
    """Start one process per local device with ``torch.multiprocessing`` and run the function in each.

    The launching process is not a rank: it holds the rendezvous store and returns global rank 0's result; when a
    worker fails, the others are stopped and it raises with that worker's traceback. A spawned worker starts as a
    forked one would (random states, determinism flags), its argument modules' CPU tensors not shared.

    Args:
        strategy: the strategy whose processes to start.
        start_method: ``"spawn"`` (the function and its arguments must be picklable, and the script guarded by
            ``if __name__ == "__main__":``), ``"fork"`` or ``"forkserver"``.

    Raises:
        ValueError: ``start_method`` is not available on this platform (``fork`` on Windows).

    Example::

        print(Fabric(accelerator="cpu", devices=2, strategy="ddp_spawn").launch(train))  # rank 0's result
    """

    requires_function = True

    def __init__(self, strategy: ParallelStrategy, start_method: str = "spawn") -> None:
        if start_method not in mp.get_all_start_methods():
            raise ValueError(
                f"The start method '{start_method}' is not available on this platform. Available methods are:"
                f" {', '.join(mp.get_all_start_methods())}"
            )
        self._strategy = strategy
        self._start_method = start_method

    @property
    @override
    def is_interactive_compatible(self) -> bool:
        return self._start_method == "fork"

    @override
    def launch(self, function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        if self._start_method == "fork":
            _check_bad_cuda_fork(self._strategy)
        else:  # spawn and forkserver import the script in new processes
            _check_missing_main_guard()
        strategy = self._strategy
        environment = strategy.cluster_environment
        strategy._set_world_ranks()  # in this process: the global rank of this node's first worker
        listener = None
        port = environment.main_port
        if strategy.node_rank == 0:
            # bound before any worker starts, the store hosted on it once they all have (a worker forked beside the
            # store's server thread can hang)
            listener = rendezvous.listen(environment, 0)
            port = listener.getsockname()[1]
        store = None
        context = mp.get_context(self._start_method)
        results = context.SimpleQueue()  # rank 0's return value; read while joining, so a large one cannot block
        # the ranks' trails of collectives, read here when a rank dies; removed after the job
        run_dir = _trail.make_run_dir()
        strategy.attach_run(RunContext(launcher="spawn", run_dir=run_dir))
        try:
            worker = _Worker(strategy, environment.main_address, port, os.getpid(), self._start_method)
            worker_args: tuple[Any, ...] = (function, args, kwargs, results)
            if self._start_method != "fork":  # a forked worker inherits these states; a new interpreter does not
                worker_args += (_GlobalStateSnapshot.capture(),)
            processes = mp.start_processes(  # type: ignore[attr-defined,no-untyped-call]
                worker, args=worker_args, nprocs=strategy.num_processes, start_method=self._start_method, join=False
            )
            if listener is not None:
                try:
                    store = rendezvous.create_store(
                        environment, 0, strategy.world_size, strategy.timeout, is_master=True, listener=listener
                    )
                except BaseException:
                    for process in processes.processes:
                        process.kill()
                    raise
            payload = _supervise(processes, results, run_dir, strategy.global_rank, strategy.world_size)
            if payload is None:
                return None  # global rank 0 runs on another node
            return pickle.loads(payload)
        finally:
            results.close()
            del store
            if listener is not None:
                listener.close()  # where the store did not take it over
            strategy.attach_run(None)
            shutil.rmtree(run_dir, ignore_errors=True)


#: Lightning Fabric's name of the launcher (the same constructor: a strategy and a start method)
_MultiProcessingLauncher = MultiProcessingLauncher


@dataclass
class _GlobalStateSnapshot:
    """Process-wide settings a spawned worker restores, to start as a forked one would (Lightning's name)."""

    use_deterministic_algorithms: bool
    use_deterministic_algorithms_warn_only: bool
    cudnn_benchmark: bool
    rng_states: dict[str, Any]

    @classmethod
    def capture(cls) -> _GlobalStateSnapshot:
        return cls(
            use_deterministic_algorithms=torch.are_deterministic_algorithms_enabled(),
            use_deterministic_algorithms_warn_only=torch.is_deterministic_algorithms_warn_only_enabled(),
            cudnn_benchmark=torch.backends.cudnn.benchmark,
            # CUDA's generators only where CUDA is initialised already: reading them would initialise it here, on
            # every GPU, in a process that computes nothing
            rng_states=_collect_rng_states(include_cuda=torch.cuda.is_initialized()),  # type: ignore[no-untyped-call]
        )

    def restore(self) -> None:
        wanted = (self.use_deterministic_algorithms, self.use_deterministic_algorithms_warn_only)
        current = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled())
        if wanted != current:
            # only on a change: the setter imports torch._inductor (seconds, and a cache folder in TMPDIR)
            torch.use_deterministic_algorithms(wanted[0], warn_only=wanted[1])
        torch.backends.cudnn.benchmark = self.cudnn_benchmark
        _set_rng_states(self.rng_states)
        if "torch.cuda" not in self.rng_states:
            # the launching process never used CUDA, so its generators hold the seed torch.manual_seed gave them
            # (lazily, as here: nothing is initialised)
            torch.cuda.manual_seed_all(torch.initial_seed())


def _check_bad_cuda_fork(strategy: ParallelStrategy) -> None:
    """Refuse to fork workers that would use CUDA after CUDA was initialised here (or in a process forked so)."""
    devices = getattr(strategy, "parallel_devices", None)
    if isinstance(devices, list) and devices and all(device.type == "cpu" for device in devices):
        return
    restart = " You will have to restart the Python kernel." if _IS_INTERACTIVE else ""
    in_bad_fork = getattr(torch.cuda, "_is_in_bad_fork", None)
    if callable(in_bad_fork) and in_bad_fork():
        raise RuntimeError(
            "Cannot re-initialize CUDA in forked subprocess: this process was forked after CUDA had been initialised,"
            " so neither it nor the processes it forks can use CUDA. Use strategy='ddp_spawn' (the 'spawn' start"
            f" method), or start this process without fork.{restart}"
        )
    if torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
        raise RuntimeError(
            "Lightning can't create new processes if CUDA is already initialized: CUDA does not survive a fork. Did"
            " you call `torch.cuda.*` functions, move the model to the GPU or allocate GPU memory before"
            f" fabric.launch()? Remove such calls, or use strategy='ddp_spawn'.{restart}"
        )


def _check_missing_main_guard() -> None:
    """Raise where a spawned worker importing the script would launch again (no ``__main__`` guard)."""
    if getattr(mp.current_process(), "_inheriting", False):
        raise RuntimeError(
            "fabric.launch() was called while a new process was importing your script: launching processes with the"
            " 'spawn' or 'forkserver' start method requires that your script guards the main code with"
            ' `if __name__ == "__main__":` (each new process imports the script, and would launch again). Put the code'
            ' that creates Fabric and calls launch() under it, or use strategy="ddp".'
        )


def _unshare_modules(data: Any) -> None:
    """Give every module in ``data`` its own copy of its CPU tensors in shared memory (tied ones stay tied)."""
    leaves, _ = flatten(data)
    with torch.no_grad():
        for module in (leaf for leaf in leaves if isinstance(leaf, Module)):
            for tensor in itertools.chain(module.parameters(), module.buffers()):
                if tensor.device.type == "cpu" and tensor.is_shared():  # type: ignore[no-untyped-call]
                    tensor.data = tensor.data.clone()


@dataclass
class _SpawnedRank:
    """A :class:`~fabric_lite.strategies.launchers._supervisor.Rank` over a ``multiprocessing`` process."""

    rank: int
    local_rank: int
    process: Any  # a started multiprocessing process
    error_file: str  # where torch.multiprocessing has the worker pickle its traceback

    @property
    def pid(self) -> int:
        return int(self.process.pid)  # a started process has one

    def poll(self) -> int | None:
        return self.process.exitcode  # type: ignore[no-any-return]

    def join(self, timeout: float | None) -> None:
        self.process.join(timeout)

    def reported(self) -> bool:
        try:
            return os.path.getsize(self.error_file) > 0
        except OSError:
            return False

    def error(self) -> str | None:
        try:
            with open(self.error_file, "rb") as f:
                return str(pickle.load(f))
        except (OSError, EOFError, pickle.UnpicklingError):
            return None


def _supervise(processes: Any, results: Any, run_dir: str, first_rank: int, world: int) -> bytes | None:
    """Wait for the workers and return rank 0's pickled result (``None`` where rank 0 runs on another node); on a
    failure, stop the others and raise with the root cause, not whichever worker ``torch.multiprocessing`` noticed
    first (a secondary failure waits :data:`_WINDOW_S` for it). ``first_rank`` is the first worker's global rank;
    ``run_dir`` holds the ranks' trails of collectives."""
    ranks = [
        _SpawnedRank(first_rank + i, i, process, processes.error_files[i])
        for i, process in enumerate(processes.processes)
    ]
    received: list[bytes] = []

    def drain() -> None:
        if not received and not results.empty():
            received.append(results.get())

    def between() -> None:
        multiprocessing.connection.wait([r.process.sentinel for r in ranks if r.poll() is None], 0.05)
        drain()

    signals = ForwardSignals(lambda signum: forward_signal(ranks, signum, _GRACE_S))
    signals.install()
    try:
        drain()
        cause = watch(ranks, RootCause(window=_WINDOW_S), between)
        if cause is None:
            drain()
            return received[0] if received else None
        root = next(rank for rank in ranks if rank.rank == cause.rank)
        index = root.local_rank  # torch.multiprocessing names a worker by its index
        if cause.code == 0:
            # the others lost a peer that had returned early: that worker is the cause
            stop(ranks, _GRACE_S)
            raise mp.ProcessExitedException(  # type: ignore[attr-defined]
                f"process {index} exited with code 0 while the other processes were still running: they then lost"
                " their peer in a collective. Every process must run the same collectives; none may return early.",
                index,
                root.pid,
                0,
            )
        report(run_dir, f"rank {cause.rank} {how_it_ended(cause.code)}", ranks, world)
        stop(ranks, _GRACE_S, run_dir)
        text = root.error()
        if text is None or BLOCK_START not in text:
            # ranks that timed out together: the one that reported is not always the one reported as the cause
            blocks = (find_block(rank.error() or "") for rank in ranks)
            block = next((b for b in blocks if b), None)
            if block:
                to_stderr(block)
        if text is not None:
            raise mp.ProcessRaisedException(  # type: ignore[attr-defined]
                f"\n\n-- Process {index} terminated with the following error:\n{text}", index, root.pid
            )
        code = cause.code
        if code < 0:
            name = signal_name(code) or f"signal {-code}"
            raise mp.ProcessExitedException(  # type: ignore[attr-defined]
                f"process {index} terminated with signal {name}", index, root.pid, code, name
            )
        raise mp.ProcessExitedException(  # type: ignore[attr-defined]
            f"process {index} terminated with exit code {code}", index, root.pid, code
        )
    finally:
        signals.restore()
        for path in processes.error_files:
            with contextlib.suppress(OSError):
                os.unlink(path)


@dataclass(frozen=True)
class _Worker:
    """What every worker runs: join the job through the launcher's store, then run the function; global rank 0
    sends its result back through ``results``. A worker dies with the launching process (``launcher_pid``)."""

    strategy: ParallelStrategy
    address: str
    port: int
    launcher_pid: int
    start_method: str

    def __call__(
        self,
        process_index: int,
        function: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        results: Any,
        global_states: _GlobalStateSnapshot | None = None,
    ) -> None:
        die_with_launcher(self.launcher_pid, is_parent=self.start_method != "forkserver")
        if global_states is not None:
            global_states.restore()
        if self.start_method != "fork":
            _unshare_modules((args, kwargs))
        strategy = self.strategy
        _set_num_threads_if_needed(strategy.num_processes)
        world_size = strategy.num_nodes * strategy.num_processes
        store = dist.TCPStore(  # type: ignore[attr-defined]
            self.address, self.port, world_size=world_size, is_master=False, timeout=strategy.timeout
        )
        run = replace(strategy.run_context, local_rank=process_index, store=store)
        os.environ.update(run.environment())  # so that any other Fabric of this process records in the same folder
        strategy.attach_run(run)
        strategy._set_world_ranks()
        try:
            result = function(*args, **kwargs)
            if strategy.global_rank == 0:
                try:
                    payload = pickle.dumps(result)
                except Exception as err:
                    raise RuntimeError(
                        f"The function passed to fabric.launch() returned a {type(result).__name__} that cannot be"
                        f" sent back to the launching process ({err}). Return something picklable (e.g. numbers,"
                        " tensors, a state dict), or nothing."
                    ) from err
                results.put(payload)
        finally:
            strategy.teardown()
