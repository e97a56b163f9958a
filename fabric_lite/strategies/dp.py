"""Data parallel in one process: ``torch.nn.DataParallel`` replicates the module on every selected CUDA device."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor
from torch.nn import DataParallel, Module
from typing_extensions import override

from fabric_lite.accelerators import Accelerator
from fabric_lite.plugins.io.checkpoint_io import CheckpointIO
from fabric_lite.plugins.precision import Precision
from fabric_lite.runtime.collectives import ops
from fabric_lite.strategies._backward_sync import _SyncBlocker
from fabric_lite.strategies.strategy import Strategy, _takes_collections
from fabric_lite.utilities.apply_func import apply_to_collection, move_data_to_device
from fabric_lite.utilities.exceptions import InvalidReduceOpError
from fabric_lite.utilities.types import ReduceOp, TBroadcast, TReduce

if TYPE_CHECKING:
    from fabric_lite.plugins.environments import ClusterEnvironment

#: the reductions over the replicas' values; ``mean`` is ``_collectives``' marker for an average
_DP_REDUCE_OPS = ("mean", "sum", "max", "min", "product")


class DataParallelStrategy(Strategy):
    """Train in one process on several CUDA devices with ``torch.nn.DataParallel``: each forward splits the batch
    across the devices and gathers the outputs on :attr:`root_device`. With one process every batch is the global
    batch; :meth:`all_reduce` reduces the values gathered from the replicas, the other collectives return their
    input. Without CUDA, ``Fabric(strategy="dp")`` warns and runs ``"ddp"``, as in Lightning.

    Args:
        accelerator, checkpoint_io, precision: as for :class:`Strategy`.
        parallel_devices: the CUDA devices (or indices) to replicate the module on, the first being the root
            device; filled in by ``Fabric`` from ``devices=``.

    Example::

        fabric = Fabric(accelerator="cuda", devices=2, strategy="dp")
    """

    drives_several_devices = True

    def __init__(
        self,
        accelerator: Accelerator | None = None,
        parallel_devices: list[torch.device] | None = None,
        checkpoint_io: CheckpointIO | None = None,
        precision: Precision | None = None,
    ) -> None:
        super().__init__(accelerator=accelerator, checkpoint_io=checkpoint_io, precision=precision)
        self._parallel_devices = list(parallel_devices) if parallel_devices is not None else None
        # one process: no synchronisation across processes to skip (no_backward_sync is a no-op)
        self._backward_sync_control = _SyncBlocker(None)

    @property
    def parallel_devices(self) -> list[torch.device] | None:
        """The devices the module is replicated on; the first one is :attr:`root_device`."""
        return self._parallel_devices

    @parallel_devices.setter
    def parallel_devices(self, devices: list[torch.device]) -> None:
        self._parallel_devices = list(devices)

    @override
    def _complete(
        self, devices: list[torch.device], *, environment: ClusterEnvironment, num_nodes: int, start_method: str | None
    ) -> None:
        if self._parallel_devices is None:
            self.parallel_devices = devices

    @property
    @override
    def root_device(self) -> torch.device:
        """The first of :attr:`parallel_devices`: where parameters live and the outputs are gathered."""
        if not self._parallel_devices:
            raise RuntimeError(
                "DataParallelStrategy has no devices yet: pass it to Fabric(strategy=..., devices=...) or give"
                " parallel_devices=[torch.device('cuda', 0), ...]."
            )
        return self._parallel_devices[0]

    # ------------------------------------------------------------------ modules and batches
    @override
    def setup_module(self, module: Module) -> DataParallel[Module]:
        """Wrap ``module`` in ``torch.nn.DataParallel`` over :attr:`parallel_devices` (output on the first one)."""
        devices = self.parallel_devices or [self.root_device]  # root_device raises the "no devices yet" error
        # an integer is a CUDA index, as DataParallel reads it (torch.device(0) would need a CUDA machine)
        non_cuda = [str(d) for d in devices if not isinstance(d, int) and torch.device(d).type != "cuda"]
        if non_cuda and torch.cuda.is_available():
            # without CUDA, DataParallel calls the module directly (Lightning Fabric relies on this on the CPU);
            # with CUDA it would fail deep inside torch with "Expected a cuda device"
            raise ValueError(
                f"DataParallelStrategy replicates the module on CUDA devices, but parallel_devices holds {non_cuda}."
                " Use CUDA devices (Fabric(accelerator='cuda', strategy='dp')), or strategy='ddp' for the CPU."
            )
        return DataParallel(module=module, device_ids=devices)

    @override
    def _unwrapped(self, module: Module) -> Module:
        # the module's name is read here, at the call, as in setup_module
        return module.module if isinstance(module, DataParallel) else module

    @override
    def module_to_device(self, module: Module) -> None:
        """Move the module to :attr:`root_device`; ``DataParallel`` copies it to the other devices in each forward."""
        module.to(self.root_device)

    @override
    def batch_to_device(self, batch: Any, device: torch.device | None = None) -> Any:
        """``batch`` as it is (``DataParallel`` scatters the inputs itself), or moved to ``device`` when given."""
        return batch if device is None else move_data_to_device(batch, device)

    # ------------------------------------------------------------------ collectives
    @override
    @_takes_collections
    def all_reduce(
        self, tensor: TReduce, group: Any | None = None, reduce_op: str | ReduceOp | None = "mean"
    ) -> TReduce:
        """Reduce the elements of each tensor in ``tensor`` (the values ``DataParallel`` gathered from its replicas)
        with ``reduce_op``, as for ``Fabric.all_reduce``. Not in place: each becomes a new 0-dim tensor; other leaves
        are left as they are; ``group`` is ignored (Lightning's always averages).

        Example::

            strategy.all_reduce(torch.tensor([1.0, 3.0]))  # tensor(2.)
        """
        return apply_to_collection(tensor, Tensor, _reduce_replicas, _replica_reduce_op(reduce_op))  # type: ignore[no-any-return]

    @override
    @_takes_collections
    def all_gather(self, tensor: Any, group: Any | None = None, sync_grads: bool = False) -> Any:
        """``tensor`` unchanged: one process, so no added dimension."""
        return tensor

    @override
    def broadcast(self, obj: TBroadcast, src: int = 0) -> TBroadcast:
        """``obj``: the one process is rank 0; ``ValueError`` for another ``src``."""
        if type(src) is not int or src != 0:
            raise ValueError(f"broadcast(src={src!r}) is not a rank: DataParallelStrategy runs one process, rank 0.")
        return obj

    @override
    def barrier(self, name: str | None = None) -> None:
        """Nothing to wait for: there is one process."""

    def __repr__(self) -> str:
        devices = [str(d) for d in self._parallel_devices] if self._parallel_devices is not None else None
        return f"{type(self).__name__}(parallel_devices={devices})"


def _replica_reduce_op(reduce_op: str | ReduceOp | None) -> Any:
    op = ops.resolve_reduce_op(reduce_op)
    if op == ops._MEAN or op in (ReduceOp.SUM, ReduceOp.MAX, ReduceOp.MIN, ReduceOp.PRODUCT):
        return op
    raise InvalidReduceOpError(
        f"DataParallelStrategy.all_reduce cannot reduce with reduce_op={reduce_op!r}: choose one of"
        f" {list(_DP_REDUCE_OPS)} (or the matching torch.distributed.ReduceOp)."
    )


def _reduce_replicas(t: Tensor, op: Any) -> Tensor:
    """Reduce all elements of ``t`` into a 0-dim tensor of ``t``'s dtype (differentiable where ``t`` is)."""
    dtype = t.dtype
    if dtype == torch.bool:
        # "any" for sum, mean and max; "all" for product and min: the multi-process strategies' meaning
        return t.all() if op in (ReduceOp.PRODUCT, ReduceOp.MIN) else t.any()
    if op == ops._MEAN:
        if t.is_floating_point() or t.is_complex():
            return t.mean()
        # integers stay integers, truncated toward zero, as the multi-process strategies do (exact, no float)
        return torch.div(t.sum(), t.numel(), rounding_mode="trunc").to(dtype)
    if op == ReduceOp.SUM:
        return t.sum().to(dtype)
    if op == ReduceOp.MAX:
        return t.max()
    if op == ReduceOp.MIN:
        return t.min()
    return t.prod().to(dtype)
