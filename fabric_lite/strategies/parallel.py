"""The base of strategies that run one process per device over a ``torch.distributed`` process group."""

from __future__ import annotations

import atexit
import os
from collections.abc import Callable
from dataclasses import replace
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
from fabric_lite.runtime import collectives, rendezvous
from fabric_lite.runtime.collectives.checked import call_key
from fabric_lite.runtime.diagnostics import CollectiveTimeoutError as CollectiveTimeoutError  # re-exported: caught here
from fabric_lite.runtime.diagnostics import RankDiagnostics, arm_nccl_flight_recorder
from fabric_lite.runtime.diagnostics import trail as _trail
from fabric_lite.runtime.run import RunContext
from fabric_lite.strategies.strategy import Strategy, _takes_collections
from fabric_lite.utilities._tree import flatten, unflatten
from fabric_lite.utilities.rank_zero import rank_zero_only
from fabric_lite.utilities.types import ReduceOp, TBroadcast, TReduce

log = get_logger(__name__)
_T = TypeVar("_T")

#: torch's own default: 30 minutes for gloo (NCCL's watchdog default is 10 minutes)
default_pg_timeout = timedelta(minutes=30)


class ParallelStrategy(Strategy):
    """One process per device, joined in a ``torch.distributed`` process group.

    ``all_reduce`` and ``all_gather`` check that every rank passes the same shapes, dtypes and reduce op, and raise
    :class:`CollectiveMismatchError` on every rank where gloo would abort or return wrong data; a call repeating the
    agreed history costs no extra collective. With ``debug_collectives`` (``Fabric(debug=True)``) every collective
    is checked, so ranks calling different collectives fail at once instead of timing out.

    Args:
        accelerator, checkpoint_io, precision: as for :class:`Strategy`.
        parallel_devices: the device of each local process; filled in by ``Fabric``.
        cluster_environment: where the ranks come from; filled in by ``Fabric``.
        process_group_backend: ``"gloo"``, ``"nccl"``, ... Defaults to NCCL for CUDA devices and gloo otherwise.
        timeout: how long collectives and the rendezvous wait for the other processes before raising.

    Example::

        fabric = Fabric(accelerator="cpu", devices=2, strategy=DDPStrategy(timeout=timedelta(minutes=5)))
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
        self._global_rank = 0
        self._world_size = 1
        # the run a launcher of fabric_lite made (attach_run); otherwise read from the environment at setup
        self._run: RunContext | None = None
        self._store: Any = None  # the rendezvous store of the process group, while it lives
        self._owns_process_group = False
        self._devices_fixed: tuple[torch.device, torch.device] | None = None  # (root device, comm device)
        # process group -> its checked collectives' state; the key holds the group, so a later group cannot reuse
        # a held one's id
        self._checked_groups: dict[Any, collectives.CheckedGroup] = {}
        # the trail of collectives and the hang report, made with the process group
        self._diagnostics: RankDiagnostics | None = None

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

    @property
    def run_context(self) -> RunContext:
        """The :class:`~fabric_lite.runtime.run.RunContext` a launcher attached, else the environment's."""
        return self._run if self._run is not None else RunContext.from_environment()

    def attach_run(self, context: RunContext | None) -> None:
        """Take the run a launcher made (folder, rendezvous store, supervisor, a worker's local rank); ``None``
        detaches it.

        Raises:
            TypeError: ``context`` is not a ``RunContext``.
        """
        if context is not None and not isinstance(context, RunContext):
            raise TypeError(f"attach_run({context!r}): expected a fabric_lite.runtime.run.RunContext or None.")
        self._run = context

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
        """How ``fabric.launch()`` starts the other local processes; ``None`` when it starts none."""
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
        """:attr:`process_group_backend` under Lightning's name, which custom strategies call."""
        return self.process_group_backend

    @property
    def timeout(self) -> timedelta:
        """How long collectives and the rendezvous wait for the other processes before raising."""
        return self._timeout

    def set_collective_timeout(self, timeout: timedelta) -> None:
        """From now on, collectives of the default process group wait ``timeout`` for the other processes: form the
        group with a generous timeout, then shorten it once running. Every process should call it.

        Raises:
            TypeError: ``timeout`` is not a ``timedelta``.
            RuntimeError: there is no process group yet.

        Example::

            fabric.strategy.set_collective_timeout(timedelta(seconds=30))
        """
        if not isinstance(timeout, timedelta):
            raise TypeError(f"set_collective_timeout({timeout!r}): expected a datetime.timedelta.")
        if not dist.is_initialized():
            raise RuntimeError("set_collective_timeout needs the process group: call fabric.launch() first.")
        from torch.distributed.distributed_c10d import _set_pg_timeout

        _set_pg_timeout(timeout)
        self._timeout = timeout
        if self._diagnostics is not None:
            self._diagnostics.timeout = timeout

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
        run = self._run
        if run is not None and run.local_rank is not None:  # a worker of the multiprocessing launcher
            return run.local_rank
        return self.cluster_environment.local_rank()

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
            self._open_diagnostics(store=None)
            return
        environment = self.cluster_environment
        store = self.run_context.store
        if store is None:
            rank = self.global_rank
            store = rendezvous.create_store(
                environment, rank, self.world_size, self._timeout, is_master=environment.hosts_store(rank)
            )
        self._store = store
        prefix = environment.store_prefix()
        store = dist.PrefixStore(prefix, store) if prefix else store  # type: ignore[attr-defined]
        if self.process_group_backend == "nccl" and self.world_size > 1 and _trail.trail_enabled():
            arm_nccl_flight_recorder(self._run_dir())
        rendezvous.form_process_group(
            backend=self.process_group_backend,
            rank=self.global_rank,
            world_size=self.world_size,
            store=store,
            timeout=self._timeout,
            device=self.root_device,
            where=f"{environment.main_address}:{environment.main_port}",
        )
        self._owns_process_group = True
        atexit.register(self._destroy_process_group)
        if self.process_group_backend == "nccl":
            # the collectives' checks (and barriers) travel on the host: the GPU's stream never waits for them
            world = collectives.CheckedGroup(None, check_group=dist.new_group(backend="gloo"))
            self._checked_groups[world.group] = world
        # which ranks a timed-out collective waited for: asked of the rendezvous store
        self._open_diagnostics(store)

    def _open_diagnostics(self, store: Any) -> None:
        """Start this rank's trail of collectives (:mod:`fabric_lite.runtime.diagnostics`) for the new process group,
        in the run's folder (afresh for every group: a process may form several)."""
        self._close_diagnostics(remove=True)
        diagnostics = RankDiagnostics(self.run_context, self.global_rank, self.world_size, store, self._timeout)
        diagnostics.open(self._run_dir())
        self._diagnostics = diagnostics
        # a process group made by the user is never destroyed by us: the files go at exit all the same
        atexit.register(self._close_diagnostics)

    @override
    def _finish_saves_after_failure(self, timeout: float | None = None) -> None:
        # bounded by the collectives' timeout: a sharded write's own collectives fail within it once a peer is gone,
        # and the launcher waits for this rank as long as it says (runtime.run.announce_save), never forever
        super()._finish_saves_after_failure(self._timeout.total_seconds() if timeout is None else timeout)

    @override
    def _launcher_run_dir(self) -> str | None:
        run = self.run_context
        return run.run_dir if run.supervised else None

    def _run_dir(self) -> str:
        """The run folder: the launcher's, else the one every local rank derives from the rendezvous settings."""
        return self.run_context.run_dir or _trail.derived_run_dir(os.environ)

    def _close_diagnostics(self, remove: bool | None = None) -> None:
        """Close this rank's trail; ``remove`` its files (by default unless the launcher removes the run folder)."""
        atexit.unregister(self._close_diagnostics)
        diagnostics, self._diagnostics = self._diagnostics, None
        if diagnostics is not None:
            diagnostics.close(remove=remove)

    def _raise_if_timed_out(self, name: str, err: BaseException) -> None:
        """Raise :class:`CollectiveTimeoutError` with the hang report if ``err`` says collective ``name`` timed out."""
        self._diagnosis().raise_if_timed_out(name, err, debug=self.debug_collectives)

    def _diagnosis(self) -> RankDiagnostics:
        """This rank's diagnosis aids; without a process group of ours, ones without a trail or a store."""
        if self._diagnostics is not None:
            return self._diagnostics
        return RankDiagnostics(self.run_context, self.global_rank, self.world_size, None, self._timeout)

    def _destroy_process_group(self) -> None:
        io = self._async_io()
        if io is not None:  # a checkpoint written in the background may still use the process group
            io._join(self._timeout.total_seconds())
        self._devices_fixed = None
        self._checked_groups.clear()
        # under fabric_lite's launchers the launcher removes the run folder; otherwise each rank removes its own files
        self._close_diagnostics()
        if self._owns_process_group and dist.is_initialized():
            rendezvous.destroy_process_group()
        self._owns_process_group = False
        self._store = None
        if self._run is not None and self._run.store is not None:  # a later group makes a store of its own
            self._run = replace(self._run, store=None)
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
            # fixed while the process group lives, and asked for on every collective: worked out once
            self._devices_fixed = fixed = (root, comm)
        return fixed[1]

    def _checked(self, group: Any | None) -> collectives.CheckedGroup:
        """The state of ``group``'s checked collectives, made at its first collective."""
        pg = group if group is not None else dist.group.WORLD
        checked = self._checked_groups.get(pg)
        if checked is None:
            checked = self._checked_groups[pg] = collectives.CheckedGroup(pg)
            if self._diagnostics is not None and pg is not dist.group.WORLD:  # the world is the trail's group 0
                self._diagnostics.register_group(checked, f"ranks {dist.get_process_group_ranks(pg)}")
        checked.predicting = not self.debug_collectives  # in debug mode every collective takes the fixed check
        return checked

    def _traced(
        self, checked: collectives.CheckedGroup, name: str, run: Callable[[], _T], describe: tuple[Any, ...]
    ) -> _T:
        """``run()``, a collective on ``checked``'s group, recorded in this rank's trail; a timeout raises
        :class:`CollectiveTimeoutError` with the hang report."""
        return self._diagnosis().traced(checked, name, run, describe, self.debug_collectives)

    @override
    @_takes_collections
    def all_reduce(
        self, tensor: TReduce, group: Any | None = None, reduce_op: str | ReduceOp | None = "mean"
    ) -> TReduce:
        """Reduce ``tensor`` (or every tensor in a collection) across processes, **in place** (see
        ``Fabric.all_reduce``); the input comes back unchanged without a process group."""
        op = collectives.resolve_reduce_op(reduce_op)
        if not dist.is_initialized():
            return tensor
        checked = self._checked(group)
        tensors = [tensor] if isinstance(tensor, Tensor) else [x for x in flatten(tensor)[0] if isinstance(x, Tensor)]
        if checked.world_size == 1 or not tensors:  # over one rank every reduction is the identity
            return tensor
        call = collectives.reduce_call(op)
        # the key that the checked core looks the call up by describes it in the trail too
        diagnostics = self._diagnostics
        key = call_key(call, tensors) if diagnostics is not None and diagnostics.trail is not None else None
        self._traced(
            checked,
            "all_reduce",
            lambda: collectives.all_reduce(tensors, op, checked, self._comm_device(), call, key),
            (call, tensors, key),
        )
        return tensor

    @override
    @_takes_collections
    def all_gather(self, tensor: Any, group: Any | None = None, sync_grads: bool = False) -> Any:
        """Gather ``tensor`` (or every tensor in a collection) from every process, as new tensors (see
        ``Fabric.all_gather``); differing shapes or dtypes raise :class:`CollectiveMismatchError` on every process."""
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
            lambda: collectives.all_gather(tensors, checked, device, sync_grads),
            ("all_gather", tensors),
        )
        if spec is None:
            return gathered[0]
        for i, value in zip(positions, gathered, strict=True):
            leaves[i] = value
        return unflatten(spec, leaves)

    @override
    def broadcast(self, obj: TBroadcast, src: int = 0) -> TBroadcast:
        """Send ``obj`` from global rank ``src`` to every process (see ``Fabric.broadcast``); all must call it."""
        if type(src) is not int or not 0 <= src < max(self.world_size, 1):
            raise ValueError(f"broadcast(src={src!r}) is not a rank: choose one of 0..{self.world_size - 1}.")
        if not dist.is_initialized():
            return obj
        call = f"broadcast(src={src})"
        checked = self._checked(None)

        def run() -> TBroadcast:
            device = self._comm_device()
            if self.debug_collectives:
                collectives.check_collective(call, [], None, device, checked.check_group)
            result: TBroadcast = collectives.broadcast(obj, src, checked, device)
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
                collectives.check_collective("barrier", [], None, self._comm_device(), host_group)
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
                collectives.check_collective(call, [], None, self._comm_device(), checked.check_group)
            return collectives.reduce_boolean_decision(decision, all, None, self._comm_device())

        return self._traced(checked, "reduce_boolean_decision", run, (call,))

    @override
    def backward(self, tensor: Tensor, module: Module | None, *args: Any, **kwargs: Any) -> None:
        # a synchronised DDP backward runs the gradient all-reduce (in C++): it is a collective of the trail too
        diagnostics = self._diagnosis()
        slot = -1
        if getattr(module, "require_backward_grad_sync", False) and dist.is_initialized():
            slot = diagnostics.enter(self._checked(None), "backward (DDP gradient all-reduce)")
        try:
            super().backward(tensor, module, *args, **kwargs)
        except BaseException as err:
            diagnostics.failed(slot, "the gradient all-reduce in backward", err, self.debug_collectives)
            raise
        diagnostics.exit(slot)

    # ------------------------------------------------------------------ checkpoints
    @override
    def _share_save_outcome(self, message: str | None) -> str | None:
        return self.broadcast(message, src=0) if dist.is_initialized() and self.world_size > 1 else message
