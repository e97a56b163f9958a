"""Horovod: ``horovodrun`` starts one process per device; gradients are averaged by Horovod's optimizer. Horovod
is optional and imported only when a :class:`HorovodStrategy` is created."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Generator
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor
from torch.nn import Module
from torch.optim import Optimizer
from typing_extensions import override

from fabric_lite.accelerators import Accelerator
from fabric_lite.plugins.environments.cluster_environment import ClusterEnvironment
from fabric_lite.plugins.environments.horovod import HorovodEnvironment
from fabric_lite.plugins.io.checkpoint_io import CheckpointIO
from fabric_lite.plugins.precision import Precision
from fabric_lite.runtime.collectives import ops
from fabric_lite.strategies._backward_sync import _SyncBlocker
from fabric_lite.strategies._horovod_ops import BROADCAST_NAME, HorovodAllGatherGrad, all_gather, all_reduce_
from fabric_lite.strategies.strategy import Strategy, _takes_collections
from fabric_lite.utilities._tree import flatten
from fabric_lite.utilities.apply_func import apply_to_collection
from fabric_lite.utilities.exceptions import InvalidReduceOpError
from fabric_lite.utilities.rank_zero import rank_zero_only
from fabric_lite.utilities.types import ReduceOp, TBroadcast, TReduce

#: how to install Horovod with what fabric_lite needs (PyTorch, Gloo; no MPI, TensorFlow or MXNet)
HOROVOD_INSTALL = (
    "HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1 HOROVOD_WITHOUT_TENSORFLOW=1"
    " HOROVOD_WITHOUT_MXNET=1 pip install --no-build-isolation horovod==0.28.1"
)
# while gradient sync is blocked, Horovod's per-parameter countdown starts here, so its hooks never fire an all-reduce
_NEVER = 1 << 30


def _import_horovod() -> Any:
    """``horovod.torch``, or a ``ModuleNotFoundError`` that says how to install it."""
    try:
        hvd = importlib.import_module("horovod.torch")
    except ImportError as err:  # not installed, or built without PyTorch / against another torch
        raise ModuleNotFoundError(
            f"strategy='horovod' needs Horovod with its PyTorch extension, which this Python ({sys.executable})"
            f" cannot import ({type(err).__name__}: {err}). Install it with:\n    {HOROVOD_INSTALL}\nHorovod 0.28.1"
            " builds from source and, against torch >= 2.1, only after switching its CMake files to C++17: the"
            " README's section 'Horovod (optional)' shows how, and .ci/setup-horovod does it all into .venv-horovod."
        ) from err
    return hvd


class HorovodStrategy(Strategy):
    """Data-parallel training with Horovod: ``horovodrun`` starts one process per device and ``fabric.launch()``
    joins them (``hvd.init()``); without ``horovodrun`` the script runs alone, as rank 0 of 1.

    ``fabric.setup`` broadcasts the module from rank 0 (it is not wrapped) and wraps each optimizer in
    ``hvd.DistributedOptimizer``, its state broadcast from rank 0. Each ``fabric.backward`` ends with the gradients
    averaged, so clipping and the step see averaged gradients, as with DDP; unlike Lightning, the learning rate is
    not scaled by the number of processes. Collectives run over every process (``group`` must be ``None``).

    Args:
        accelerator, parallel_devices, cluster_environment, precision: filled in by ``Fabric`` when not given;
            each process computes on ``parallel_devices[local_rank]``.
        checkpoint_io: how rank 0 writes checkpoint files and every rank reads them (default ``TorchCheckpointIO``).

    Raises:
        ModuleNotFoundError: Horovod (with its PyTorch extension) cannot be imported; the message says how to
            install it.

    Example::

        # horovodrun -np 2 -H localhost:2 python train.py
        fabric = Fabric(strategy="horovod")
    """

    is_parallel = True
    own_environment = HorovodEnvironment

    def __init__(
        self,
        accelerator: Accelerator | None = None,
        parallel_devices: list[torch.device] | None = None,
        cluster_environment: ClusterEnvironment | None = None,
        checkpoint_io: CheckpointIO | None = None,
        precision: Precision | None = None,
    ) -> None:
        super().__init__(accelerator=accelerator, checkpoint_io=checkpoint_io, precision=precision)
        self._hvd = _import_horovod()
        self._parallel_devices = list(parallel_devices) if parallel_devices is not None else None
        self._cluster_environment = cluster_environment
        self._initialised = False
        self._owns_horovod = False
        # every optimizer this strategy wrapped, and those whose gradients post_backward already averaged
        self._optimizers: list[Any] = []
        self._synchronized: set[int] = set()
        self._sync_blocked = 0
        self._backward_sync_control = _SyncBlocker(self._block_sync)

    # ------------------------------------------------------------------ configuration (filled in by Fabric)
    @property
    def parallel_devices(self) -> list[torch.device] | None:
        return self._parallel_devices

    @parallel_devices.setter
    def parallel_devices(self, devices: list[torch.device]) -> None:
        self._parallel_devices = list(devices)

    @property
    def cluster_environment(self) -> ClusterEnvironment:
        if self._cluster_environment is None:
            self._cluster_environment = HorovodEnvironment()
        return self._cluster_environment

    @cluster_environment.setter
    def cluster_environment(self, environment: ClusterEnvironment) -> None:
        self._cluster_environment = environment

    @override
    def _complete(
        self, devices: list[torch.device], *, environment: ClusterEnvironment, num_nodes: int, start_method: str | None
    ) -> None:
        if self._parallel_devices is None:
            self.parallel_devices = devices
        if self._cluster_environment is None:
            self.cluster_environment = environment

    # ------------------------------------------------------------------ ranks and devices
    @property
    @override
    def global_rank(self) -> int:
        return int(self._hvd.rank()) if self._initialised else self.cluster_environment.global_rank()

    @property
    @override
    def local_rank(self) -> int:
        return int(self._hvd.local_rank()) if self._initialised else self.cluster_environment.local_rank()

    @property
    @override
    def node_rank(self) -> int:
        return int(self._hvd.cross_rank()) if self._initialised else self.cluster_environment.node_rank()

    @property
    @override
    def world_size(self) -> int:
        return int(self._hvd.size()) if self._initialised else self.cluster_environment.world_size()

    @property
    @override
    def root_device(self) -> torch.device:
        """This process's device: ``parallel_devices[local_rank]`` (``cuda:<local rank>`` on GPUs)."""
        if not self._parallel_devices:
            raise RuntimeError("HorovodStrategy has no devices yet; it is configured by Fabric(strategy=...).")
        local_rank = self.local_rank
        if not 0 <= local_rank < len(self._parallel_devices):
            raise RuntimeError(
                f"Horovod's local rank {local_rank} has no device: parallel_devices holds"
                f" {len(self._parallel_devices)} ({[str(d) for d in self._parallel_devices]}). Start as many"
                " processes per node as there are devices."
            )
        return self._parallel_devices[local_rank]

    @property
    def handles_gradient_accumulation(self) -> bool:
        """``True``: Horovod's optimizer defers its all-reduce inside :meth:`no_backward_sync` itself."""
        return True

    @override
    def setup_environment(self) -> None:
        """Join the Horovod job (``hvd.init()``) and select this process's device; ``RuntimeError`` where Horovod
        sees another world size than horovodrun's environment announced."""
        hvd = self._hvd
        if not hvd.is_initialized():
            hvd.init()
            self._owns_horovod = True
        self._initialised = True
        rank_zero_only.rank = self.global_rank  # type: ignore[attr-defined]
        environment = self.cluster_environment
        if environment.creates_processes_externally and environment.world_size() != hvd.size():
            raise RuntimeError(
                f"Horovod joined {hvd.size()} processes, but the environment announced {environment.world_size()}."
                " Start every process with the same horovodrun command."
            )
        super().setup_environment()

    # ------------------------------------------------------------------ modules and optimizers
    @override
    def module_to_device(self, module: Module) -> None:
        """Move the module to :attr:`root_device` (on CUDA, make it the current device first)."""
        if self.root_device.type == "cuda":
            torch.cuda.set_device(self.root_device)
        module.to(self.root_device)

    def model_to_device(self, module: Module) -> None:
        """The name PyTorch Lightning's ``HorovodStrategy`` used for :meth:`module_to_device`."""
        self.module_to_device(module)

    @override
    def setup_module(self, module: Module) -> Module:
        """Broadcast the module's parameters and buffers from rank 0, in place; the module is not wrapped. Every
        process must call it, with modules of the same structure."""
        self._hvd.broadcast_parameters(module.state_dict(), root_rank=0)
        return module

    @override
    def setup_module_and_optimizers(
        self, module: Module, optimizers: list[Optimizer], scheduler: Any = None
    ) -> tuple[Module, list[Optimizer], Any]:
        """Broadcast the module from rank 0 and wrap each optimizer in ``hvd.DistributedOptimizer``."""
        module = self.setup_module(module)
        return module, [self._wrap_optimizer(optimizer, module) for optimizer in optimizers], scheduler

    @override
    def setup_optimizer(self, optimizer: Optimizer) -> Optimizer:
        """Wrap ``optimizer`` in ``hvd.DistributedOptimizer`` over the same parameter groups (schedulers made on the
        original keep working), with rank 0's state and hyperparameters on every process."""
        return self._wrap_optimizer(optimizer, None)

    def _wrap_optimizer(self, optimizer: Optimizer, module: Module | None) -> Optimizer:
        hvd = self._hvd
        index = len(self._optimizers)
        params = [p for group in optimizer.param_groups for p in group["params"]]
        names = {id(p): name for name, p in module.named_parameters()} if module is not None else {}
        # unique across optimizers: Horovod matches the processes' all-reduces by name
        named = [(f"fabric_lite.opt{index}.{names.get(id(p), f'param{i}')}", p) for i, p in enumerate(params)]
        state = optimizer.state_dict()
        wrapped = hvd.DistributedOptimizer(optimizer, named_parameters=named)
        if state["state"]:
            wrapped.load_state_dict(state)  # DistributedOptimizer is a new optimizer over the same param groups
        self._broadcast_optimizer_state(wrapped)
        _accept_set_to_none(wrapped)
        self._optimizers.append(wrapped)
        return wrapped  # type: ignore[no-any-return]

    def _broadcast_optimizer_state(self, optimizer: Any) -> None:
        """Give every process rank 0's optimizer state and hyperparameters. ``hvd.broadcast_optimizer_state`` steps
        once to initialise an empty state (moving weight-decayed parameters), so it is used only where every process
        has a state; otherwise rank 0's state dict is sent whole."""
        hvd = self._hvd
        if self.world_size == 1:
            return
        lacking = torch.tensor([0 if optimizer.state_dict()["state"] else 1], dtype=torch.int32)
        hvd.allreduce_(lacking, op=hvd.Max, name=f"{BROADCAST_NAME}.has_state")
        if int(lacking[0]) == 0:  # every process has a state
            hvd.broadcast_optimizer_state(optimizer, root_rank=0)
            return
        state = hvd.broadcast_object(optimizer.state_dict(), root_rank=0, name=f"{BROADCAST_NAME}.optimizer")
        if self.global_rank != 0:
            optimizer.load_state_dict(state)

    # ------------------------------------------------------------------ backward and step
    @override
    def backward(self, tensor: Tensor, module: Module | None, *args: Any, **kwargs: Any) -> None:
        """Back-propagate, then (outside :meth:`no_backward_sync`) average the gradients: :meth:`post_backward`."""
        super().backward(tensor, module, *args, **kwargs)
        if self._sync_blocked == 0:
            self.post_backward(tensor)

    def post_backward(self, closure_loss: Tensor) -> None:
        """Wait for the gradients' all-reduce of every optimizer set up here, so clipping and the step see averaged
        gradients. Every process must call it (``fabric.backward`` does)."""
        for optimizer in self._optimizers:
            optimizer.synchronize()
            self._synchronized.add(id(optimizer))

    @override
    def optimizer_step(self, optimizer: Optimizer, **kwargs: Any) -> Any:
        """Step, all-reducing first only where :meth:`post_backward` has not (a plain ``loss.backward()``)."""
        if id(optimizer) in self._synchronized:
            self._synchronized.discard(id(optimizer))
            with optimizer.skip_synchronize():  # type: ignore[attr-defined]
                return super().optimizer_step(optimizer, **kwargs)
        return super().optimizer_step(optimizer, **kwargs)

    @contextmanager
    def _block_sync(self) -> Generator[None, None, None]:
        """``fabric.no_backward_sync``: the next ``fabric.backward`` outside averages the accumulated gradients."""
        passes = [optimizer.backward_passes_per_step for optimizer in self._optimizers]
        self._sync_blocked += 1
        try:
            if self._sync_blocked == 1:
                for optimizer in self._optimizers:
                    optimizer.set_backward_passes_per_step(_NEVER)
            yield
        finally:
            self._sync_blocked -= 1
            if self._sync_blocked == 0:
                # resets each parameter's countdown, so the next backward all-reduces the accumulated gradients
                for optimizer, count in zip(self._optimizers, passes, strict=False):
                    optimizer.set_backward_passes_per_step(count)

    # ------------------------------------------------------------------ collectives
    def _check_group(self, name: str, group: Any | None) -> None:
        if group is not None:
            raise ValueError(
                f"HorovodStrategy.{name}(group={group!r}): Horovod runs collectives over every process, not over"
                " torch.distributed groups. Pass group=None."
            )

    @override
    @_takes_collections
    def all_reduce(
        self, tensor: TReduce, group: Any | None = None, reduce_op: str | ReduceOp | None = "mean"
    ) -> TReduce:
        """Reduce ``tensor`` (or every tensor in a collection) over every process, **in place**, as
        ``Fabric.all_reduce`` does (``reduce_op`` one of ``"mean"``, ``"sum"``, ``"max"``, ``"min"``, ``"product"``).
        Every process must call it with the same shapes and dtypes, in the same order.

        Example::

            # rank 0: torch.tensor([1.0])   rank 1: torch.tensor([3.0])
            strategy.all_reduce(t)  # every rank: tensor([2.])
        """
        self._check_group("all_reduce", group)
        op = ops.resolve_reduce_op(reduce_op)
        if op not in (ops._MEAN, ReduceOp.SUM, ReduceOp.MAX, ReduceOp.MIN, ReduceOp.PRODUCT):
            raise InvalidReduceOpError(
                f"HorovodStrategy.all_reduce cannot reduce with reduce_op={reduce_op!r}: choose one of 'mean',"
                " 'sum', 'max', 'min', 'product'."
            )
        if not self._initialised:
            return tensor
        tensors = [tensor] if isinstance(tensor, Tensor) else [x for x in flatten(tensor)[0] if isinstance(x, Tensor)]
        for members in ops._group_by_device_dtype(tensors) if tensors else []:
            aliases = [ops._alias(t) for t in members]
            buffer = ops._flat_buffer(aliases)
            all_reduce_(self._hvd, buffer, op, self.world_size)
            ops._write_back(buffer, aliases)
        return tensor

    def reduce(self, tensor: Any, group: Any | None = None, reduce_op: str | ReduceOp | None = "mean") -> Any:
        """The name PyTorch Lightning's ``HorovodStrategy`` used for :meth:`all_reduce` (``"mean"`` by default)."""
        return self.all_reduce(tensor, group=group, reduce_op=reduce_op)

    @override
    @_takes_collections
    def all_gather(self, tensor: Any, group: Any | None = None, sync_grads: bool = False) -> Any:
        """Gather ``tensor`` (or every tensor in a collection) from every process into new tensors of shape
        ``(world_size, *shape)``; shapes must match. With ``sync_grads=True`` each process's tensor receives the
        **sum** of its slice's gradients, as with DDP (Horovod's ``allgather`` would average them).

        Example::

            # rank 0: torch.tensor([1, 2])   rank 1: torch.tensor([3, 4])
            strategy.all_gather(t)  # every rank: tensor([[1, 2], [3, 4]])
        """
        self._check_group("all_gather", group)
        if not self._initialised or self.world_size == 1:
            return tensor
        return apply_to_collection(tensor, Tensor, self._gather_one, sync_grads)

    def _gather_one(self, tensor: Tensor, sync_grads: bool) -> Tensor:
        if sync_grads:
            return HorovodAllGatherGrad.apply(tensor, self._hvd)  # type: ignore[no-any-return, no-untyped-call]
        return all_gather(self._hvd, tensor.detach())

    @override
    def broadcast(self, obj: TBroadcast, src: int = 0) -> TBroadcast:
        """Send ``obj`` from global rank ``src`` to every process (pickled; a tensor arrives on each process's
        device). Every process must call it.

        Example::

            # rank 0: obj = {"lr": 0.1}   rank 1: obj = None
            strategy.broadcast(obj, src=0)  # every rank: {"lr": 0.1}
        """
        if type(src) is not int or not 0 <= src < max(self.world_size, 1):
            raise ValueError(f"broadcast(src={src!r}) is not a rank: choose one of 0..{self.world_size - 1}.")
        if not self._initialised or self.world_size == 1:
            return obj
        # an explicit name: Horovod's default (the object's type name) differs between ranks that pass None
        result = self._hvd.broadcast_object(obj, root_rank=src, name=BROADCAST_NAME)
        if isinstance(result, Tensor) and self.global_rank != src:
            result = result.to(self.root_device)
        return result  # type: ignore[no-any-return]

    @override
    def barrier(self, name: str | None = None) -> None:
        """Wait until every process has entered the barrier (``hvd.barrier()``)."""
        if self._initialised and self.world_size > 1:
            self._hvd.barrier()

    @override
    def reduce_boolean_decision(self, decision: bool, all: bool = True) -> bool:
        """``all`` (or ``any``) of every process's decision, in one all-reduce; the same on every process."""
        if not self._initialised or self.world_size == 1:
            return bool(decision)
        hvd = self._hvd
        flag = torch.tensor([1 if decision else 0], dtype=torch.int32)
        hvd.allreduce_(flag, op=hvd.Min if all else hvd.Max, name=f"{BROADCAST_NAME}.decision")
        return bool(flag.item())

    # ------------------------------------------------------------------ checkpoints and teardown
    @override
    def _share_save_outcome(self, message: str | None) -> str | None:
        return self.broadcast(message, src=0)

    @override
    def teardown(self) -> None:
        """Wait for every process (``hvd.join()``), then shut Horovod down if this strategy started it."""
        if self._initialised and self._hvd.is_initialized():
            self._hvd.join()
            if self._owns_horovod:
                self._hvd.shutdown()
        self._initialised = False
        self._owns_horovod = False
        self._optimizers.clear()
        self._synchronized.clear()
        super().teardown()

    def __repr__(self) -> str:
        return f"{type(self).__name__}(world_size={self.world_size})"


def _accept_set_to_none(optimizer: Any) -> None:
    """Horovod's ``DistributedOptimizer.zero_grad()`` takes no argument; give it torch's ``set_to_none``, keeping
    Horovod's own check (no gradient may be cleared while its all-reduce is still in flight)."""
    horovod_zero_grad = optimizer.zero_grad

    def zero_grad(set_to_none: bool = True) -> None:
        if set_to_none:
            horovod_zero_grad()
            return
        if getattr(optimizer, "_handles", None):
            horovod_zero_grad()  # raises Horovod's own error about pending all-reduces
        Optimizer.zero_grad(optimizer, set_to_none=False)

    optimizer.zero_grad = zero_grad
