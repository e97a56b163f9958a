"""The base of strategies that run one process per device over a ``torch.distributed`` process group."""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any, TypeVar

import torch
import torch.distributed as dist
from torch import Tensor
from torch.nn import Module
from typing_extensions import override

from fabric_lite._log import get_logger
from fabric_lite.accelerators import Accelerator
from fabric_lite.plugins.environments import ClusterEnvironment, LightningEnvironment
from fabric_lite.plugins.io.checkpoint_io import CheckpointIO
from fabric_lite.plugins.precision import Precision
from fabric_lite.strategies.strategy import Strategy, _takes_collections
from fabric_lite.utilities import _collectives, _trail
from fabric_lite.utilities._collectives.checked import call_key
from fabric_lite.utilities._tree import flatten, unflatten
from fabric_lite.utilities.rank_zero import rank_zero_only
from fabric_lite.utilities.types import ReduceOp, TBroadcast, TReduce

log = get_logger(__name__)

_JOINED_KEY = "fabric_lite/joined"
_T = TypeVar("_T")


class CollectiveTimeoutError(RuntimeError):
    """A collective (or the rendezvous) waited longer than the process-group timeout for the other ranks."""


def is_timeout(err: BaseException) -> bool:
    """Whether a backend error says that the operation timed out (gloo and NCCL word it differently)."""
    text = str(err)
    return "Timed out" in text or "timed out" in text or "Timeout" in text or "timeout" in text


def _read_counter(store: Any, key: str) -> int | str:
    try:
        return int(store.add(key, 0))
    except Exception:  # diagnosis only
        return "an unknown number"


_WORKER_DRAIN_SECONDS = 0.05
#: torch's own default: 30 minutes for gloo (NCCL's watchdog default is 10 minutes)
default_pg_timeout = timedelta(minutes=30)


class ParallelStrategy(Strategy):
    """One process per device, joined in a ``torch.distributed`` process group.

    Collectives run over that group (gloo on the CPU, NCCL on CUDA, unless ``process_group_backend`` says
    otherwise). Collections of tensors are reduced and gathered through one flat buffer per dtype and device.

    Args:
        accelerator, checkpoint_io, precision: as for :class:`Strategy`.
        parallel_devices: the device of each local process; filled in by ``Fabric``.
        cluster_environment: where the ranks come from; filled in by ``Fabric``.
        process_group_backend: ``"gloo"``, ``"nccl"``, ... Defaults to NCCL for CUDA devices and gloo otherwise.
        timeout: how long collectives and the rendezvous wait for the other processes before raising.

    ``all_reduce`` and ``all_gather`` always check that every rank passes tensors of the same shapes and dtypes (and
    the same reduce op): a mismatch raises :class:`CollectiveMismatchError` on every rank with a per-rank table, where
    gloo would abort or return wrong data (the tensors of that call are then undefined). The check costs one small
    all-gather, which also carries payloads of up to 480 bytes; a call that every rank's history of agreed calls
    predicts (a training loop's, from its second round) costs nothing more than the backend's collective: see
    ``fabric_lite.utilities._collectives.predicted``. With NCCL the checks travel on a gloo group beside it, built from
    the tensors' metadata on the host, and ``barrier`` meets there too, so none of these makes the host wait for the
    GPU; the data stay on the device. With ``debug_collectives`` (set by
    ``Fabric(debug=True)`` or ``FABRIC_LITE_DEBUG=1``) ``broadcast``, ``barrier`` and ``reduce_boolean_decision``
    are checked too, so ranks that call different collectives at the same point are named at once instead of
    timing out (and no call is predicted).

    Example::

        strategy = DDPStrategy(timeout=timedelta(minutes=5))  # a ParallelStrategy
        fabric = Fabric(accelerator="cpu", devices=2, strategy=strategy)
        fabric.launch()
        strategy.world_size, strategy.global_rank  # (2, 0) on rank 0, (2, 1) on rank 1
    """

    is_parallel = True
    #: check every collective (not only all_reduce and all_gather) across ranks before running it
    debug_collectives = False

    def __init__(
        self,
        accelerator: Accelerator | None = None,
        parallel_devices: list[torch.device] | None = None,
        cluster_environment: ClusterEnvironment | None = None,
        checkpoint_io: CheckpointIO | None = None,
        precision: Precision | None = None,
        process_group_backend: str | None = None,
        timeout: timedelta | None = default_pg_timeout,
    ) -> None:
        super().__init__(accelerator=accelerator, checkpoint_io=checkpoint_io, precision=precision)
        if timeout is not None and not isinstance(timeout, timedelta):
            raise TypeError(f"timeout must be a datetime.timedelta, got {timeout!r}. Example: timedelta(minutes=5).")
        self._parallel_devices = parallel_devices
        self._cluster_environment = cluster_environment
        self._process_group_backend = process_group_backend
        self._start_method: str | None = None  # set by the subclasses that start processes (_set_start_method)
        self._timeout = timeout if timeout is not None else default_pg_timeout
        self._num_nodes = 1
        self._local_rank: int | None = None  # set by the spawn launcher in each worker
        self._global_rank = 0
        self._world_size = 1
        # how this process reaches the rendezvous store; set by launchers, otherwise derived from the environment
        self._store: Any = None
        self._timeouts = 0
        self._store_is_external = False
        self._owns_process_group = False
        # fixed while a process group lives, and asked for on every collective (set up in _setup_distributed)
        self._devices_fixed: tuple[torch.device, torch.device] | None = None  # (root device, comm device)
        # process group -> the state of its checked collectives (history, plans, check group), for as long as the
        # group lives: the key holds the group, so a group made later cannot take a held one's place
        self._checked_groups: dict[Any, _collectives.CheckedGroup] = {}
        # this rank's trail of collectives (fabric_lite.utilities._trail), for the hang report; made with the group.
        # The run folder and who supervises the ranks ("script", "spawn", "cli") are set by fabric_lite's launchers
        self._trail: _trail.Trail | None = None
        self._report_on_term: Any = None  # a _hang_report.ReportOnTerm, under torchrun and `fabric-lite run`
        self._run_dir: str | None = None
        self._launcher_kind: str | None = None

    # ------------------------------------------------------------------ configuration (filled in by Fabric)
    @property
    def parallel_devices(self) -> list[torch.device] | None:
        """The device of each local process (``None`` until ``Fabric`` fills it in)."""
        return self._parallel_devices

    @parallel_devices.setter
    def parallel_devices(self, devices: list[torch.device]) -> None:
        self._parallel_devices = devices

    @property
    def cluster_environment(self) -> ClusterEnvironment:
        """Where the ranks come from: fabric_lite's own launcher, torchrun, SLURM, ..."""
        if self._cluster_environment is None:
            self._cluster_environment = LightningEnvironment()
        return self._cluster_environment

    @cluster_environment.setter
    def cluster_environment(self, environment: ClusterEnvironment) -> None:
        self._cluster_environment = environment

    @property
    def num_nodes(self) -> int:
        """How many machines take part."""
        return self._num_nodes

    @num_nodes.setter
    def num_nodes(self, num_nodes: int) -> None:
        self._num_nodes = num_nodes

    @property
    def num_processes(self) -> int:
        """Processes per node."""
        return len(self._parallel_devices) if self._parallel_devices is not None else 0

    @override
    def _complete(
        self, devices: list[torch.device], *, environment: ClusterEnvironment, num_nodes: int, start_method: str | None
    ) -> None:
        if self.parallel_devices is None:
            self.parallel_devices = devices
        if self._cluster_environment is None:
            self.cluster_environment = environment
        self.num_nodes = num_nodes
        self._set_world_ranks()
        # imported here: a single-device run never needs the launchers (or multiprocessing, subprocess, ...)
        from fabric_lite.strategies.launchers import MultiProcessingLauncher, SubprocessScriptLauncher

        environment = self.cluster_environment
        started_by_us = isinstance(environment, LightningEnvironment) and environment.creates_processes_externally
        if start_method == "popen" or started_by_us:
            # in a child of the script launcher, the launcher reports the child's errors to rank 0
            self._launcher = SubprocessScriptLauncher(self)
        elif start_method is not None:
            self._launcher = MultiProcessingLauncher(self, start_method=start_method)

    @property
    @override
    def start_method(self) -> str | None:
        """How ``fabric.launch()`` starts the other local processes: ``"popen"`` (the script is run again),
        ``"spawn"``, ``"fork"`` (or, for DDP, ``"forkserver"``); ``None`` when it starts none."""
        return self._start_method

    def _set_start_method(self, start_method: str, choices: tuple[str, ...] = ("popen", "spawn", "fork")) -> None:
        """Take a subclass's ``start_method`` argument, or refuse one that is not among ``choices``."""
        if start_method not in choices:
            raise ValueError(f"{type(self).__name__}(start_method={start_method!r}) is not one of {choices}.")
        self._start_method = start_method

    @property
    def process_group_backend(self) -> str:
        """The ``torch.distributed`` backend: the one given, else NCCL for CUDA devices and gloo otherwise."""
        if self._process_group_backend is not None:
            return self._process_group_backend
        return "nccl" if self.root_device.type == "cuda" else "gloo"

    def _get_process_group_backend(self) -> str:
        """:attr:`process_group_backend` under Lightning Fabric's name for it, which custom strategies call."""
        return self.process_group_backend

    @property
    def timeout(self) -> timedelta:
        """How long collectives and the rendezvous wait for the other processes before raising."""
        return self._timeout

    def set_collective_timeout(self, timeout: timedelta) -> None:
        """From now on, collectives of the default process group wait ``timeout`` for the other processes.

        For a job whose processes start slowly (imports, a loaded machine) but must fail fast once running: form the
        group with a generous ``timeout``, then shorten it after ``fabric.launch()``. Every process should call it.

        Raises:
            TypeError: ``timeout`` is not a ``timedelta``.
            RuntimeError: there is no process group yet.

        Example::

            fabric = Fabric(devices=2, strategy=DDPStrategy(timeout=timedelta(minutes=5)))
            fabric.launch()
            fabric.strategy.set_collective_timeout(timedelta(seconds=30))
        """
        if not isinstance(timeout, timedelta):
            raise TypeError(f"set_collective_timeout({timeout!r}): expected a datetime.timedelta.")
        if not dist.is_initialized():
            raise RuntimeError("set_collective_timeout needs the process group: call fabric.launch() first.")
        from torch.distributed.distributed_c10d import _set_pg_timeout

        _set_pg_timeout(timeout)
        self._timeout = timeout

    # ------------------------------------------------------------------ ranks
    @property
    @override
    def root_device(self) -> torch.device:
        if self._devices_fixed is not None:
            return self._devices_fixed[0]
        if not self._parallel_devices:
            raise RuntimeError(f"{type(self).__name__} has no devices yet; it is configured by Fabric(...).")
        return self._parallel_devices[self.local_rank]

    @property
    @override
    def local_rank(self) -> int:
        return self._local_rank if self._local_rank is not None else self.cluster_environment.local_rank()

    @property
    @override
    def node_rank(self) -> int:
        return self.cluster_environment.node_rank()

    @property
    @override
    def global_rank(self) -> int:
        return self._global_rank

    @property
    @override
    def world_size(self) -> int:
        return self._world_size

    def _set_world_ranks(self) -> None:
        """Work out this process's global rank and the world size from the environment and the settings."""
        environment = self.cluster_environment
        environment.set_global_rank(self.node_rank * self.num_processes + self.local_rank)
        environment.set_world_size(self.num_nodes * self.num_processes)
        self._global_rank = environment.global_rank()
        self._world_size = environment.world_size()
        rank_zero_only.rank = self._global_rank  # type: ignore[attr-defined]

    # ------------------------------------------------------------------ process group
    @override
    def setup_environment(self) -> None:
        super().setup_environment()
        self._setup_distributed()

    def _setup_distributed(self) -> None:
        self._set_world_ranks()
        self._devices_fixed = None
        self._checked_groups.clear()
        if dist.is_initialized():
            # someone (the user, a test harness) created the default group already: use it if it matches
            if dist.get_world_size() != self.world_size or dist.get_rank() != self.global_rank:
                raise RuntimeError(
                    f"A torch.distributed process group already exists with rank {dist.get_rank()} of"
                    f" {dist.get_world_size()}, but Fabric expects rank {self.global_rank} of {self.world_size}."
                    " Destroy it first (torch.distributed.destroy_process_group()) or match the settings."
                )
            self._open_trail()
            return
        kwargs: dict[str, Any] = {
            "backend": self.process_group_backend,
            "rank": self.global_rank,
            "world_size": self.world_size,
            "timeout": self._timeout,
        }
        if self.root_device.type == "cuda":
            kwargs["device_id"] = self.root_device
        environment = self.cluster_environment
        store = self._store
        if store is None:
            store = self._create_store(
                is_master=environment.hosts_store(self.global_rank) and not self._store_is_external
            )
        prefix = environment.store_prefix()
        store = dist.PrefixStore(prefix, store) if prefix else store  # type: ignore[attr-defined]
        kwargs["store"] = store
        if self.process_group_backend == "nccl" and self.world_size > 1 and _trail.trail_enabled():
            # torch's flight recorder of NCCL calls, dumped by its watchdog on a timeout into the run folder, where the
            # hang report reads each rank's last entry (the device's side, beside the trail's host side)
            from fabric_lite.utilities._hang_report import FLIGHT_RECORDER_PREFIX

            run_dir = self._resolve_run_dir()
            os.environ.setdefault("TORCH_FR_BUFFER_SIZE", "2000")
            os.environ.setdefault("TORCH_NCCL_DUMP_ON_TIMEOUT", "1")
            os.environ.setdefault("TORCH_FR_DUMP_TEMP_FILE", os.path.join(run_dir, FLIGHT_RECORDER_PREFIX))
            os.makedirs(run_dir, exist_ok=True)
        # kept for diagnosis: which ranks joined, which ranks a timed-out collective waited for
        self._diagnosis_store = store
        store.add(_JOINED_KEY, 1)
        log.debug("initialising the process group: rank %d of %d", self.global_rank, self.world_size)
        try:
            dist.init_process_group(**kwargs)
        except RuntimeError as err:
            if not is_timeout(err):
                raise
            joined = _read_counter(store, _JOINED_KEY)
            raise CollectiveTimeoutError(
                f"The process group did not form within {self._timeout}: {joined} of {self.world_size} ranks joined"
                f" the rendezvous at {environment.main_address}:{environment.main_port}. The missing ranks never"
                " started, crashed before joining, or were given another address or port."
            ) from err
        self._owns_process_group = True
        atexit.register(self._destroy_process_group)
        if self.process_group_backend == "nccl":
            # the collectives' checks (and barriers) travel on the host: the GPU's stream never waits for them
            world = _collectives.CheckedGroup(None, check_group=dist.new_group(backend="gloo"))
            self._checked_groups[world.group] = world
        self._open_trail()

    def _open_trail(self) -> None:
        """Start this rank's trail of collectives in the job's run folder (see ``fabric_lite.utilities._trail``): set
        by fabric_lite's launchers, else derived from the rendezvous settings, which every local rank shares."""
        self._close_trail(remove=True)
        if self.world_size < 2 or not _trail.trail_enabled():  # one rank cannot wait for another
            return
        run_dir = self._resolve_run_dir()
        try:
            self._trail = _trail.Trail(run_dir, self.global_rank, self.world_size)
        except OSError as err:  # a diagnosis aid: never a reason to fail the job
            log.warning("fabric_lite: no trail of collectives for the hang report (%s)", err)
            return
        self._trail.register_stacks()
        # a process group made by the user is never destroyed by us: the files go at exit all the same
        atexit.register(self._close_trail)
        if self._launcher_kind not in _trail.SUPERVISING_LAUNCHERS:
            # torchrun's agent ends the survivors of a death with SIGTERM, often before their collective fails
            from fabric_lite.utilities._hang_report import ReportOnTerm

            watch = ReportOnTerm(
                run_dir,
                self.global_rank,
                lambda: self._collect_report(f"rank {self.global_rank} was stopped (SIGTERM) after another rank ended"),
                # no launcher of ours removes the run folder: the last rank out does, as at a clean exit
                on_exit=self._trail.close if self._launcher_kind is None else None,
            )
            self._report_on_term = watch if watch.install() else None

    def _resolve_run_dir(self) -> str:
        """The job's run folder: set by fabric_lite's launchers, else derived from the rendezvous settings (afresh
        for every process group: a process may form several, one after the other)."""
        self._launcher_kind = self._launcher_kind or os.environ.get(_trail.ENV_LAUNCHER)
        return self._run_dir or os.environ.get(_trail.ENV_RUN_DIR) or _trail.derived_run_dir(os.environ)

    def _close_trail(self, remove: bool | None = None) -> None:
        """Close this rank's trail; ``remove`` its files (by default unless one of fabric_lite's launchers, which
        removes the whole run folder after the job, started this process)."""
        atexit.unregister(self._close_trail)
        if remove is None:
            remove = self._launcher_kind not in (*_trail.SUPERVISING_LAUNCHERS, "cli")
        watch, self._report_on_term = self._report_on_term, None
        if watch is not None:
            watch.uninstall()
        trail, self._trail = self._trail, None
        if trail is not None:
            trail.close(remove=remove)

    def _raise_if_timed_out(self, name: str, err: BaseException, seq: int | None = None) -> None:
        """Raise the error for a collective that timed out, naming it and, where the store can tell, the missing
        ranks, followed by the hang report (where every rank of this node was, and its stack); return if ``err`` is
        not a timeout (the caller re-raises it). ``seq``: the collective's number in this rank's trail.

        Every rank whose collective timed out records it in the rendezvous store; after a short wait, the ranks
        that did not are the ones that never took part (stuck elsewhere, dead, or calling another collective).
        Only runs after a failure: nothing of this is on the normal path.
        """
        if not is_timeout(err):
            return
        self._timeouts += 1
        store = getattr(self, "_diagnosis_store", None)
        found: list[list[int]] = []
        if store is not None:
            key = f"fabric_lite/timed_out/{self._timeouts}"
            pause = min(1.0, self._timeout.total_seconds())

            def diagnose() -> None:
                try:
                    store.set(f"{key}/{self.global_rank}", name)
                    time.sleep(pause)
                    found.append([r for r in range(self.world_size) if not store.check([f"{key}/{r}"])])
                except Exception:  # the store may be gone too; the diagnosis is a bonus
                    pass

            # in a thread with a bounded wait: cut off from the store's host (a network split), a store call can
            # block for as long as the kernel keeps the TCP connection, many minutes, with no timeout of its own
            thread = threading.Thread(target=diagnose, name="fabric_lite-timeout-diagnosis", daemon=True)
            thread.start()
            thread.join(pause + 2.0)
        missing = found[0] if found else None
        who = f"rank(s) {missing} never took part in it" if missing else "not every rank took part in it"
        hint = (
            ""
            if self.debug_collectives
            else " To see what every rank calls, run again with FABRIC_LITE_DEBUG=1 (or Fabric(debug=True)): ranks"
            " calling different collectives then raise at once with a per-rank table."
        )
        number = f" #{seq}" if seq is not None else ""
        block = self._hang_report(f"{name}{number} timed out after {self._timeout} on rank {self.global_rank}")
        if block is None and self._trail is not None:
            block = "(where every rank was: in the report of another rank of this node)"
        raise CollectiveTimeoutError(
            f"{name} on {self.world_size} ranks timed out after {self._timeout}: {who} (stuck elsewhere, dead, or"
            f" calling a different collective). Every rank must call the same collectives in the same order.{hint}"
            f" (backend: {str(err).splitlines()[0] if str(err) else type(err).__name__})"
            + (f"\n{block}" if block else "")
        ) from err

    def _create_store(self, is_master: bool) -> Any:
        environment = self.cluster_environment
        port = environment.main_port
        if not is_master and port == 0:
            raise RuntimeError(
                f"Rank {self.global_rank} cannot reach the main process: MASTER_PORT is not set. Start every node"
                " with the same MASTER_ADDR and MASTER_PORT."
            )
        try:
            return dist.TCPStore(  # type: ignore[attr-defined]
                environment.main_address,
                port,
                world_size=self.world_size,
                is_master=is_master,
                timeout=self._timeout,
                wait_for_workers=False,
            )
        except (RuntimeError, OSError) as err:
            role = "host" if is_master else "reach"
            raise RuntimeError(
                f"Rank {self.global_rank} could not {role} the rendezvous store at"
                f" {environment.main_address}:{port} ({err}). If the port is in use, pick a free MASTER_PORT"
                " (or unset it to let fabric_lite choose one)."
            ) from err

    def _destroy_process_group(self) -> None:
        io = self._async_io()
        if io is not None:  # a checkpoint written in the background may still use the process group
            io._join(self._timeout.total_seconds())
        self._devices_fixed = None
        self._checked_groups.clear()
        # fabric_lite's launchers remove the whole run folder after the job (after reading it if a rank failed);
        # under another launcher each rank removes its own files, and those of ranks that died
        self._close_trail()
        if self._owns_process_group and dist.is_initialized():
            dist.destroy_process_group()
            # gloo's worker threads release the work objects of asynchronous collectives (DDP's gradient
            # all-reduce) after the caller has moved on, and releasing one takes the GIL. A worker thread still
            # waiting for the GIL when the interpreter finalises is torn down inside a destructor and the whole
            # process aborts ("terminate called without an active exception": 5 of 60 two-rank DDP runs here).
            # Sleeping releases the GIL so that those threads finish first (0 of 60 runs with this pause).
            time.sleep(_WORKER_DRAIN_SECONDS)
        self._owns_process_group = False
        self._store = None
        atexit.unregister(self._destroy_process_group)

    @override
    def teardown(self) -> None:
        self._destroy_process_group()
        super().teardown()

    # ------------------------------------------------------------------ collectives
    def _comm_device(self) -> torch.device:
        """Where small bookkeeping tensors live: the device for NCCL, the CPU for everything else."""
        fixed = self._devices_fixed
        if fixed is None:
            root = self.root_device
            comm = root if self.process_group_backend == "nccl" else torch.device("cpu")
            if not dist.is_initialized():
                return comm
            # the devices cannot change while the process group lives; asked for on every collective, they are
            # worked out once (from the environment: tens of microseconds)
            self._devices_fixed = fixed = (root, comm)
        return fixed[1]

    def _checked(self, group: Any | None) -> _collectives.CheckedGroup:
        """The state of ``group``'s checked collectives (the default group's for ``None``), made at its first
        collective and dropped with the process group; its calls are predicted unless ``debug_collectives`` is set."""
        pg = group if group is not None else dist.group.WORLD
        checked = self._checked_groups.get(pg)
        if checked is None:
            checked = self._checked_groups[pg] = _collectives.CheckedGroup(pg)
            if self._trail is not None and pg is not dist.group.WORLD:  # the world group is the trail's group 0
                self._trail.register_group(checked, f"ranks {dist.get_process_group_ranks(pg)}")
        checked.predicting = not self.debug_collectives  # in debug mode every collective takes the fixed check
        return checked

    def _traced(
        self, checked: _collectives.CheckedGroup, name: str, run: Callable[[], _T], describe: tuple[Any, ...]
    ) -> _T:
        """``run()``, a collective on ``checked``'s group, recorded in this rank's trail (``trail.describe(*describe)``
        says what it is); if it raises, :meth:`_collective_failed` handles the error, under ``name``, before it
        propagates."""
        trail = self._trail
        slot = trail.enter(checked, trail.describe(*describe), 2) if trail is not None else -1
        try:
            result = run()
        except BaseException as err:
            self._collective_failed(slot, name, err)
            raise
        if trail is not None:
            trail.exit(slot)
        return result

    def _collective_failed(self, slot: int, name: str, err: BaseException) -> None:
        """A collective raised ``err``: mark its record in the trail failed, raise :class:`CollectiveTimeoutError`
        (with the hang report) if it timed out, and report where every rank is when a peer went away under a
        launcher that does not watch the ranks itself (torchrun, ``fabric-lite run``). Returns otherwise (the caller
        re-raises ``err``)."""
        trail = self._trail
        seq = trail.seq_at(slot) if trail is not None and slot >= 0 else None
        try:  # the report shows this rank waiting, as it was: the record is marked failed after it
            self._raise_if_timed_out(name, err, seq=seq)
            if trail is not None and self._launcher_kind not in _trail.SUPERVISING_LAUNCHERS:
                # fabric_lite's own launchers see a death themselves, and report it; under the others, this rank does
                self._report_lost_peer(name, seq, err)
        finally:
            if trail is not None and slot >= 0:
                trail.exit(slot, _trail.FAILED)

    def _report_lost_peer(self, name: str, seq: int | None, err: BaseException) -> None:
        from fabric_lite.strategies.launchers.launcher import is_secondary

        if not (isinstance(err, Exception) and is_secondary(err)):
            return
        what = f"{name}{f' #{seq}' if seq is not None else ''} failed on rank {self.global_rank}: a peer went away"
        self._hang_report(what, print_block=True)
        if self._report_on_term is not None:
            # the agent stops this rank in a moment: wait for that rather than race it with writing the error file
            time.sleep(2.0)

    def _hang_report(self, reason: str, *, print_block: bool = False) -> str | None:
        """The hang report (``fabric_lite.utilities._hang_report``) from this rank, for its error, or ``None`` when
        another process of this node reports.

        With ``print_block``, and always under torchrun's agent (``ReportOnTerm`` watches for its SIGTERM), the block
        is printed here, under the watcher's lock, and the return is ``SEE_ABOVE``: the agent may stop this rank the
        moment the lock is free, before an exception that carried the block would be printed.
        """
        watch = self._report_on_term
        with watch.lock if watch is not None else contextlib.nullcontext():
            block = self._collect_report(reason)
            if not block or not (print_block or watch is not None):
                return block
            sys.stderr.write(block + "\n")
            sys.stderr.flush()
        from fabric_lite.utilities._hang_report import SEE_ABOVE

        return SEE_ABOVE

    def _collect_report(self, reason: str) -> str | None:
        trail = self._trail
        if trail is None:
            return None
        from fabric_lite.utilities import _hang_report

        try:
            return _hang_report.collect(
                trail.run_dir, reason=reason, world_size=self.world_size, own_rank=self.global_rank
            )
        except Exception as err:  # a diagnosis aid: never in the way of the real error
            log.warning("fabric_lite: could not build the hang report (%s)", err)
            return None

    @override
    @_takes_collections
    def all_reduce(
        self, tensor: TReduce, group: Any | None = None, reduce_op: str | ReduceOp | None = "mean"
    ) -> TReduce:
        """Reduce ``tensor`` (or every tensor in a collection) across processes, **in place**.

        Every process must call it with tensors of the same shapes and dtypes, in the same order. Each tensor is
        overwritten with the reduced value and the input is returned. Non-tensor leaves are left as they are.
        Without a process group this returns the input unchanged.
        """
        op = _collectives.resolve_reduce_op(reduce_op)
        if not dist.is_initialized():
            return tensor
        checked = self._checked(group)
        tensors = [tensor] if isinstance(tensor, Tensor) else [x for x in flatten(tensor)[0] if isinstance(x, Tensor)]
        if checked.world_size == 1 or not tensors:  # over one rank every reduction is the identity
            return tensor
        call = _collectives.reduce_call(op)
        # the key that the checked core looks the call up by describes it in the trail too
        key = call_key(call, tensors) if self._trail is not None else None
        self._traced(
            checked,
            "all_reduce",
            lambda: _collectives.all_reduce(tensors, op, checked, self._comm_device(), call, key),
            (call, tensors, key),
        )
        return tensor

    @override
    @_takes_collections
    def all_gather(self, tensor: Any, group: Any | None = None, sync_grads: bool = False) -> Any:
        """Gather ``tensor`` (or every tensor in a collection) from every process, as new tensors.

        Each result has shape ``(world_size, *shape)``; with a world size of 1 the input is returned unchanged, as
        Lightning Fabric documents. Shapes and dtypes must match across processes, otherwise every process raises
        ``ValueError`` with a per-rank table. With ``sync_grads=True`` the result is differentiable and each
        process's tensor receives the sum, over processes, of the gradients of its slice.
        """
        if not dist.is_initialized():
            return tensor
        checked = self._checked(group)
        if checked.world_size == 1:
            return tensor
        device = self._comm_device()
        leaves, spec = ([tensor], None) if isinstance(tensor, Tensor) else flatten(tensor)
        positions = [i for i, leaf in enumerate(leaves) if isinstance(leaf, Tensor)]
        tensors = [leaves[i] for i in positions]
        gathered = self._traced(
            checked,
            "all_gather",
            lambda: _collectives.all_gather(tensors, checked, device, sync_grads),
            ("all_gather", tensors),
        )
        if spec is None:
            return gathered[0]
        for i, value in zip(positions, gathered, strict=True):
            leaves[i] = value
        return unflatten(spec, leaves)

    @override
    def broadcast(self, obj: TBroadcast, src: int = 0) -> TBroadcast:
        """Send ``obj`` from global rank ``src`` to every process and return it on every process.

        Tensors are sent as tensors and arrive on each process's device; other objects are pickled. On ``src`` the
        object itself is returned. Every process must call it.
        """
        if type(src) is not int or not 0 <= src < max(self.world_size, 1):
            raise ValueError(f"broadcast(src={src!r}) is not a rank: choose one of 0..{self.world_size - 1}.")
        if not dist.is_initialized():
            return obj
        call = f"broadcast(src={src})"
        checked = self._checked(None)

        def run() -> TBroadcast:
            device = self._comm_device()
            if self.debug_collectives:
                _collectives.check_collective(call, [], None, device, checked.check_group)
            result: TBroadcast = _collectives.broadcast(obj, src, checked, device)
            return result

        return self._traced(checked, call, run, (call, [obj] if isinstance(obj, Tensor) else ()))

    @override
    def barrier(self, name: str | None = None) -> None:
        """Wait until every process has entered the barrier. A no-op without a process group."""
        if not dist.is_initialized():
            return
        checked = self._checked(None)

        def run() -> None:
            host_group = checked.check_group
            if self.debug_collectives:
                _collectives.check_collective("barrier", [], None, self._comm_device(), host_group)
            if host_group is not None:
                dist.barrier(group=host_group)  # the processes meet on the host; the GPU's work goes on
            elif dist.get_backend() == "nccl" and self.root_device.type == "cuda":
                dist.barrier(device_ids=[self.root_device.index])
            else:
                dist.barrier()

        self._traced(checked, f"barrier({name!r})" if name else "barrier", run, ("barrier",))

    @override
    def reduce_boolean_decision(self, decision: bool, all: bool = True) -> bool:
        """``all`` (or ``any``) of every process's decision, in one collective; the same on every process."""
        if not dist.is_initialized():
            return bool(decision)
        call = f"reduce_boolean_decision(all={all})"
        checked = self._checked(None)

        def run() -> bool:
            if self.debug_collectives:
                _collectives.check_collective(call, [], None, self._comm_device(), checked.check_group)
            return _collectives.reduce_boolean_decision(decision, all, None, self._comm_device())

        return self._traced(checked, "reduce_boolean_decision", run, (call,))

    @override
    def backward(self, tensor: Tensor, module: Module | None, *args: Any, **kwargs: Any) -> None:
        # a synchronised DDP backward runs the gradient all-reduce (in C++): it is a collective of the trail too
        trail = self._trail
        slot = -1
        if trail is not None and getattr(module, "require_backward_grad_sync", False) and dist.is_initialized():
            slot = trail.enter(self._checked(None), trail.describe("backward (DDP gradient all-reduce)"), 1)
        try:
            super().backward(tensor, module, *args, **kwargs)
        except BaseException as err:
            self._collective_failed(slot, "the gradient all-reduce in backward", err)
            raise
        if trail is not None and slot >= 0:
            trail.exit(slot)

    # ------------------------------------------------------------------ checkpoints
    @override
    def _share_save_outcome(self, message: str | None) -> str | None:
        return self.broadcast(message, src=0) if dist.is_initialized() and self.world_size > 1 else message
