"""Distributed utilities (Lightning's ``utilities.distributed``). Each works without a process group (an identity
or a no-op there); each that communicates must be called by every process of ``group``."""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sized
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeGuard

import torch
import torch.distributed as dist
from torch import Tensor
from torch.utils.data import Dataset, DistributedSampler, Sampler
from typing_extensions import Self

from fabric_lite._log import get_logger
from fabric_lite.runtime import collectives
from fabric_lite.utilities._fs import _is_local_file_protocol, _local_path
from fabric_lite.utilities.imports import _TORCH_GREATER_EQUAL_2_4
from fabric_lite.utilities.types import _PATH, ReduceOp

if TYPE_CHECKING:
    from torch.distributed.tensor import DTensor
    from torch.nn.parallel import DistributedDataParallel

    from fabric_lite.plugins.environments import ClusterEnvironment
    from fabric_lite.strategies import Strategy

log = get_logger(__name__)

__all__ = [
    "AllGatherGrad",
    "DistributedSamplerWrapper",
    "all_gather_ddp_if_available",
    "distributed_available",
    "gather_all_tensors",
    "init_dist_connection",
    "is_shared_filesystem",
    "register_ddp_comm_hook",
    "sync_ddp",
    "sync_ddp_if_available",
]


def distributed_available() -> bool:
    """Whether a default ``torch.distributed`` process group exists in this process.

    Example::

        distributed_available()  # False in a single process
    """
    return dist.is_available() and dist.is_initialized()


class AllGatherGrad(collectives.gather._AllGatherGrad):
    """A differentiable all-gather: ``AllGatherGrad.apply(tensor, group=None)``.

    Every rank gets ``(world_size, *tensor.shape)``. In the backward, the gradients are summed over the ranks and each
    rank's ``tensor`` receives its own slice. Every rank must run forward and backward; shapes and dtypes must match.

    Example::

        # rank 0: x = tensor([1.])   rank 1: x = tensor([2.])   (both requires_grad=True)
        gathered = AllGatherGrad.apply(x)  # every rank: tensor([[1.], [2.]])
    """


def all_gather_ddp_if_available(tensor: Tensor, group: Any | None = None, sync_grads: bool = False) -> Tensor:
    """Gather ``tensor`` (the same shape and dtype everywhere) from every process of ``group``.

    Every process gets a new ``(world_size, *tensor.shape)`` tensor; without a process group, ``tensor`` itself.
    ``sync_grads=True`` makes the result differentiable (see :class:`AllGatherGrad`).

    Example::

        # rank 0: tensor([1, 2])   rank 1: tensor([3, 4])
        all_gather_ddp_if_available(t)  # every rank: tensor([[1, 2], [3, 4]])
    """
    if not distributed_available():
        return tensor
    # one small collective first, so that different shapes raise on every rank instead of crashing gloo
    collectives.check_collective("all_gather", [tensor], group, tensor.device)
    with contextlib.nullcontext() if sync_grads else torch.no_grad():
        return AllGatherGrad.apply(tensor, group)  # type: ignore[no-any-return,no-untyped-call]


def gather_all_tensors(result: Tensor, group: Any | None = None) -> list[Tensor]:
    """Gather a tensor whose size may differ across processes (its number of dimensions and dtype may not).

    Every process gets one tensor per rank of ``group``; ``[result]`` without a process group.

    Raises:
        ValueError: on every process, when the number of dimensions or the dtype differs; the message lists each rank's.

    Example::

        # rank 0: tensor([1, 2])   rank 1: tensor([3])
        gather_all_tensors(t)  # every rank: [tensor([1, 2]), tensor([3])]
    """
    if not isinstance(result, Tensor):
        raise TypeError(f"gather_all_tensors expects a tensor, got {type(result).__name__}: {result!r}.")
    return collectives.gather_uneven(result, group) if distributed_available() else [result]


def _as_tensor(result: Any) -> Tensor:
    if isinstance(result, Tensor):
        return result
    if isinstance(result, (bool, int, float)):
        # NCCL only reduces tensors on the GPU; gloo and the others on the CPU
        on_gpu = dist.get_backend() == "nccl" and torch.cuda.is_available()
        device = torch.device("cuda", torch.cuda.current_device()) if on_gpu else torch.device("cpu")
        return torch.tensor(result, device=device)
    raise TypeError(
        f"sync_ddp reduces a tensor or a number, got {type(result).__name__}: {result!r}. To reduce a collection,"
        " use fabric.all_reduce(...)."
    )


def sync_ddp(result: Tensor | float, group: Any | None = None, reduce_op: str | ReduceOp | None = None) -> Tensor:
    """Reduce ``result`` (same shape and dtype everywhere) over ``group``, **in place**; every process gets the result.

    A Python number is made a tensor first. ``reduce_op``: ``None``/``"sum"`` (default), ``"mean"``/``"avg"`` (integer
    tensors keep their dtype, truncated), ``"max"``, ``"min"``, ``"product"``, or a ``torch.distributed.ReduceOp``.

    Raises:
        ValueError: an unknown ``reduce_op``.

    Example::

        # rank 0: tensor(1.)   rank 1: tensor(3.)
        sync_ddp(t, reduce_op="mean")  # every rank: tensor(2.)
    """
    op = collectives.resolve_reduce_op(reduce_op)
    tensor = _as_tensor(result)
    collectives.all_reduce_([tensor], op, group, dist.get_backend(group))
    return tensor


def sync_ddp_if_available(
    result: Tensor | float, group: Any | None = None, reduce_op: str | ReduceOp | None = None
) -> Tensor | float:
    """:func:`sync_ddp` where a process group exists; ``result`` unchanged otherwise.

    Example::

        loss_sum = sync_ddp_if_available(loss_sum, reduce_op="sum")
    """
    if not distributed_available():
        collectives.resolve_reduce_op(reduce_op)  # a wrong reduce_op fails on one process too
        return result
    return sync_ddp(result, group=group, reduce_op=reduce_op)


def init_dist_connection(
    cluster_environment: ClusterEnvironment,
    torch_distributed_backend: str,
    global_rank: int | None = None,
    world_size: int | None = None,
    **kwargs: Any,
) -> None:
    """Create the default process group from a cluster environment, through ``MASTER_ADDR``/``MASTER_PORT``.

    Sets both in ``os.environ``; ``global_rank`` and ``world_size`` default to the environment's, ``**kwargs`` go to
    ``torch.distributed.init_process_group``. A group with the same settings is kept; NCCL groups are destroyed at exit.

    Raises:
        RuntimeError: ``torch.distributed`` is unavailable, or a default group exists with other settings.
        ValueError: more than one process but no ``MASTER_PORT``.

    Example::

        init_dist_connection(LightningEnvironment(), "gloo", global_rank=rank, world_size=2)
    """
    if not dist.is_available():
        raise RuntimeError(
            "torch.distributed is not available in this build of PyTorch, so no process group can be created."
        )
    rank = cluster_environment.global_rank() if global_rank is None else global_rank
    size = cluster_environment.world_size() if world_size is None else world_size
    if dist.is_initialized():
        existing = (dist.get_backend(), dist.get_rank(), dist.get_world_size())
        if existing != (torch_distributed_backend, rank, size):
            raise RuntimeError(
                f"init_dist_connection(backend={torch_distributed_backend!r}, global_rank={rank},"
                f" world_size={size}): a default process group already exists with backend={existing[0]!r}, rank"
                f" {existing[1]}, world size {existing[2]}. Destroy it first"
                " (torch.distributed.destroy_process_group()) or call with the same settings."
            )
        log.debug("torch.distributed is already initialised with the same settings: nothing to do")
        return
    port = cluster_environment.main_port
    if port == 0 and size > 1:
        raise ValueError(
            f"init_dist_connection: {size} processes need a port to meet at, but {type(cluster_environment).__name__}"
            " has none (MASTER_PORT is not set). Set MASTER_PORT (the same free port on every process)."
        )
    os.environ["MASTER_ADDR"] = cluster_environment.main_address
    os.environ["MASTER_PORT"] = str(port)
    log.info("initialising distributed: GLOBAL_RANK: %d, MEMBER: %d/%d", rank, rank + 1, size)
    dist.init_process_group(torch_distributed_backend, rank=rank, world_size=size, **kwargs)
    if torch_distributed_backend == "nccl":
        # torch warns at exit about an NCCL group that was not destroyed (and may hang in its teardown)
        atexit.register(_destroy_dist_connection)


def register_ddp_comm_hook(
    model: DistributedDataParallel | Any,
    ddp_comm_state: object | None = None,
    ddp_comm_hook: Callable[..., Any] | None = None,
    ddp_comm_wrapper: Callable[..., Any] | None = None,
) -> None:
    """Register ``ddp_comm_hook`` (PyTorch's ``ddp_comm_hooks``), with its state and wrapper, on a DDP model.

    ``model`` is the ``DistributedDataParallel`` module or the module ``fabric.setup`` returned around one. Without a
    process group, or without a hook, nothing is registered.

    Raises:
        ValueError: a state or a wrapper without a hook.
        TypeError: ``model`` is no DDP model, or the hook is not callable.

    Example::

        register_ddp_comm_hook(ddp_model, ddp_comm_hook=default_hooks.fp16_compress_hook)
    """
    if ddp_comm_hook is None:
        if ddp_comm_state is not None or ddp_comm_wrapper is not None:
            given = "ddp_comm_state" if ddp_comm_state is not None else "ddp_comm_wrapper"
            raise ValueError(
                f"register_ddp_comm_hook got {given} but no ddp_comm_hook: the state and the wrapper only apply to a"
                " hook. Pass ddp_comm_hook=..., e.g. powerSGD_hook.powerSGD_hook with a PowerSGDState."
            )
        return
    if not callable(ddp_comm_hook) or (ddp_comm_wrapper is not None and not callable(ddp_comm_wrapper)):
        raise TypeError(
            f"ddp_comm_hook and ddp_comm_wrapper must be callables, got {ddp_comm_hook!r} and {ddp_comm_wrapper!r}."
            " Example: ddp_comm_hook=default_hooks.fp16_compress_hook."
        )
    if not distributed_available():
        return
    from torch.nn.parallel import DistributedDataParallel

    ddp = getattr(model, "_strategy_module", model)  # the module fabric.setup returned wraps the DDP module
    if not isinstance(ddp, DistributedDataParallel):
        raise TypeError(
            f"register_ddp_comm_hook needs a DistributedDataParallel model, got {type(model).__name__}. Set the model"
            " up with a DDP strategy first (fabric.setup(model)), or wrap it in DistributedDataParallel."
        )
    hook = ddp_comm_hook
    if ddp_comm_wrapper is not None:
        log.info("applying the DDP comm wrapper: %s(%s)", _name(ddp_comm_wrapper), _name(ddp_comm_hook))
        hook = ddp_comm_wrapper(ddp_comm_hook)
    log.debug("registering the DDP comm hook %s", _name(hook))
    ddp.register_comm_hook(state=ddp_comm_state, hook=hook)


def _name(fn: Callable[..., Any]) -> str:
    return str(getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or fn)


class _DatasetSamplerWrapper(Dataset[Any]):
    """A sampler's indices as a dataset: item ``i`` is the ``i``-th index of the pass drawn by :meth:`reset`."""

    def __init__(self, sampler: Sampler[Any] | Iterable[Any]) -> None:
        sized = isinstance(sampler, Sized)
        if not isinstance(sampler, Sized) or len(sampler) == float("inf"):
            problem, fix = ("an infinite length", "a finite __len__") if sized else ("no __len__", "a __len__")
            raise TypeError(
                f"You seem to have configured a sampler in your DataLoader: {type(sampler).__name__} has {problem},"
                f" so it cannot be split across processes by DistributedSamplerWrapper. Give it {fix}, or pass"
                " use_distributed_sampler=False to setup_dataloaders and split the data yourself."
            )
        self._sampler = sampler
        self._sampler_list: list[Any] | None = None  # drawn on first use, not at construction

    @property
    def sampler(self) -> Sampler[Any] | Iterable[Any]:
        """The wrapped sampler."""
        return self._sampler

    def __getitem__(self, index: int) -> Any:
        if self._sampler_list is None:
            self._sampler_list = list(self._sampler)
        return self._sampler_list[index]

    def __len__(self) -> int:
        return len(self._sampler)

    def reset(self) -> None:
        """Draw the sampler's indices for a new pass."""
        self._sampler_list = list(self._sampler)


class DistributedSamplerWrapper(DistributedSampler):  # type: ignore[type-arg]
    """Splits the indices of any sized sampler across processes, as ``DistributedSampler`` splits a dataset.

    Each ``iter()`` draws the wrapped sampler once and keeps this process's share by ``DistributedSampler``'s rules
    (``*args``/``**kwargs`` are its arguments); ``set_epoch`` is forwarded to the wrapped sampler.

    Raises:
        TypeError: the sampler has no ``__len__`` or an infinite one.

    Example::

        sampler = DistributedSamplerWrapper(WeightedRandomSampler(weights, 1000), num_replicas=2, rank=rank)
    """

    def __init__(self, sampler: Sampler[Any] | Iterable[Any], *args: Any, **kwargs: Any) -> None:
        super().__init__(_DatasetSamplerWrapper(sampler), *args, **kwargs)

    def __iter__(self) -> Iterator[Any]:
        dataset: _DatasetSamplerWrapper = self.dataset  # type: ignore[assignment]
        dataset.reset()
        return (dataset[index] for index in super().__iter__())

    def set_epoch(self, epoch: int) -> None:
        """Set the epoch here and in the wrapped sampler, where it has ``set_epoch``."""
        super().set_epoch(epoch)
        inner = getattr(self.dataset._sampler, "set_epoch", None)  # type: ignore[attr-defined]
        if callable(inner):
            inner(epoch)


def is_shared_filesystem(strategy: Strategy, path: _PATH | None = None, timeout: int = 3) -> bool:
    """Whether ``path`` (default: the working directory) is on a filesystem every process sees; all must call it.

    Rank 0 writes a marker file and the others look for it for up to ``timeout`` seconds. A URL or a single process
    answers ``True``; ranks whose ``path`` resolves differently answer ``False``.

    Raises:
        FileNotFoundError: ``path`` does not exist on some rank.

    Example::

        if is_shared_filesystem(fabric.strategy, "checkpoints/"):
            ...  # rank 0 alone may write files that every rank reads
    """
    if path is not None and not _is_local_file_protocol(path):
        return True
    resolved = Path(Path.cwd() if path is None else _local_path(path)).resolve()  # file:///a -> /a
    if getattr(strategy, "world_size", 1) == 1:
        return True
    # the same path on every rank is necessary for a shared filesystem (cheap, and no file is written)
    if not strategy.reduce_boolean_decision(strategy.broadcast(resolved) == resolved, all=True):
        return False
    if not strategy.reduce_boolean_decision(resolved.exists(), all=True):
        raise FileNotFoundError(
            f"Unable to determine if the path belongs to a shared filesystem. The path does not exist: {resolved}"
        )
    check_file = (resolved.parent if resolved.is_file() else resolved) / ".lightning_shared_fs_check"
    check_file.unlink(missing_ok=True)
    strategy.barrier()
    if strategy.is_global_zero:
        check_file.touch()
        found = True
    else:
        start = time.perf_counter()
        found = False
        while not found and (time.perf_counter() - start) < timeout:
            found = check_file.exists()
            if not found:
                time.sleep(0.01)
    strategy.barrier()
    all_found = strategy.reduce_boolean_decision(found, all=True)
    with contextlib.suppress(OSError):  # another rank may have removed it already
        check_file.unlink()
    return all_found


def _destroy_dist_connection() -> None:
    """Destroy the default process group, if any, with Ctrl+C held off so that no half-destroyed group is left."""
    if not distributed_available():
        return
    previous = (
        signal.signal(signal.SIGINT, signal.SIG_IGN) if threading.current_thread() is threading.main_thread() else None
    )
    try:
        dist.destroy_process_group()
    finally:
        if previous is not None:
            signal.signal(signal.SIGINT, previous)


def _get_default_process_group_backend_for_device(device: torch.device) -> str:
    """torch's default backend for ``device``'s type, else ``"gloo"``."""
    return dist.Backend.default_device_backend_map.get(device.type, "gloo")


def _num_cpus_available() -> int:
    """The CPU cores this process may run on (its affinity)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    count = os.cpu_count()
    return 1 if count is None else count


def _suggested_max_num_threads(num_processes: int = 1) -> int:
    """This process's share of the cores when ``num_processes`` run on the machine (at least 1); raises ``ValueError``
    when ``num_processes < 1``."""
    if num_processes < 1:
        raise ValueError(f"`num_processes` should be >= 1, got {num_processes}.")
    return max(1, _num_cpus_available() // num_processes)


def _set_num_threads_if_needed(num_processes: int = 1) -> None:
    """Give torch and child processes (``OMP_NUM_THREADS``) this process's share of the cores unless
    ``OMP_NUM_THREADS`` is set: a thread per core in each of N processes would oversubscribe the machine."""
    if "OMP_NUM_THREADS" not in os.environ:
        threads = _suggested_max_num_threads(num_processes)
        torch.set_num_threads(threads)
        os.environ["OMP_NUM_THREADS"] = str(threads)


class _InfiniteBarrier:
    """A barrier with no time limit, for ranks that wait on something long (a download) that no timeout may cut.

    Inside the block, ``barrier()`` waits on a gloo group of its own (gloo honours a practically infinite timeout);
    leaving the block waits once more and destroys it. Without a process group it calls ``fallback``, or nothing.
    Every process must call ``barrier()`` equally often.
    """

    def __init__(self, fallback: Callable[[], Any] | None = None) -> None:
        self.group: Any = None
        self.barrier: Callable[[], Any] = fallback or _no_wait

    def __call__(self) -> None:
        self.barrier()

    def __enter__(self) -> Self:
        if _distributed_is_initialized():
            self.group = torch.distributed.new_group(backend="gloo", timeout=timedelta(days=10000))
            self.barrier = self.group.monitored_barrier
        return self

    def __exit__(self, *exc_info: object) -> None:
        try:
            self.barrier()
        finally:
            if self.group is not None:
                torch.distributed.destroy_process_group(self.group)


def _no_wait() -> None:
    """The barrier of a single process."""


def _is_dtensor(tensor: Any) -> TypeGuard[DTensor]:
    """Whether ``tensor`` is a ``torch.distributed.tensor.DTensor`` (a tensor sharded over a device mesh)."""
    if not _TORCH_GREATER_EQUAL_2_4:
        return False
    from torch.distributed.tensor import DTensor

    return isinstance(tensor, DTensor)


if dist.is_available():
    #: torch.distributed's ``group`` (``group.WORLD``), which clients import from here, as from Lightning Fabric
    group = dist.group
else:  # a build of torch without distributed support

    class group:  # type: ignore[no-redef]
        """Where torch.distributed is missing: no process group, not even the world."""

        WORLD = None


# Lightning Fabric's private names for the functions above (clients' custom strategies import them)
_distributed_is_initialized = distributed_available
_gather_all_tensors = gather_all_tensors
_sync_ddp = sync_ddp
_sync_ddp_if_available = sync_ddp_if_available
_all_gather_ddp_if_available = all_gather_ddp_if_available
_init_dist_connection = init_dist_connection
