"""Collectives over ``torch.distributed``, on a process group of the collective's own."""

from __future__ import annotations

import datetime
import os
from typing import Any, ClassVar

import torch
import torch.distributed as dist
from torch import Tensor
from typing_extensions import Self, override

from fabric_lite.plugins.collectives.collective import Collective
from fabric_lite.utilities.types import ReduceOp as _ReduceOp

#: torch.distributed's default timeout of a collective (Lightning's name; 30 minutes where torch.distributed is missing)
default_pg_timeout = dist.constants.default_pg_timeout if dist.is_available() else datetime.timedelta(minutes=30)
#: what the ``op`` strings name, beyond ``ReduceOp``'s own members (matched case-insensitively)
_OP_ALIASES = {"MEAN": "AVG", "PROD": "PRODUCT"}


class TorchCollective(Collective):
    """Collective and point-to-point calls through ``torch.distributed``, on a group this object owns.

    Every member of the group must make every call, in the same order (``send``/``recv`` by the pair). On a process
    outside the group (:meth:`create_group` with ``ranks=``) the calls return the tensor unchanged, ``rank`` and
    ``world_size`` are ``-1`` and ``barrier`` returns at once. ``op`` is a ``ReduceOp`` or its name in any case
    (``"sum"``, ``"product"``, ``"min"``, ``"max"``, ``"avg"``, also ``"mean"`` and ``"prod"``).

    Example::

        collective = TorchCollective().setup(backend="gloo")  # RANK, WORLD_SIZE, MASTER_ADDR/PORT set by a launcher
        collective.create_group()
        collective.all_reduce(torch.tensor([rank + 1.0]), op="sum")  # rank 0: tensor([3.])   rank 1: tensor([3.])
        collective.teardown()  # destroys its group, and the default group that setup() created
    """

    #: whether ``setup()`` created the default group, which the last ``teardown()`` destroys (a class attribute:
    #: the process has one default group, whichever collective created it)
    manages_default_group: ClassVar[bool] = False
    addr_key = "MASTER_ADDR"
    port_key = "MASTER_PORT"

    def __init__(self) -> None:
        if not dist.is_available():
            raise RuntimeError(
                "TorchCollective needs torch.distributed, which this torch build does not have"
                f" (torch {torch.__version__}). Install a torch build with distributed support."
            )
        super().__init__()

    @property
    @override
    def group(self) -> Any:
        """The group the calls run on: the one made by :meth:`create_group`, else the default group."""
        if self._group is None:
            self._group = dist.GroupMember.WORLD
        return super().group

    @property
    @override
    def rank(self) -> int:
        """This process's rank within :attr:`group` (``-1`` outside it)."""
        return dist.get_rank(self.group)

    @property
    @override
    def world_size(self) -> int:
        """The size of :attr:`group` (``-1`` outside it)."""
        return dist.get_world_size(self.group)

    # ------------------------------------------------------------------ collectives
    @override
    def broadcast(self, tensor: Tensor, src: int) -> Tensor:
        """Overwrite ``tensor`` in place with global rank ``src``'s, on every member; returns it."""
        dist.broadcast(tensor, src, group=self.group)
        return tensor

    @override
    def all_reduce(self, tensor: Tensor, op: str | _ReduceOp | Any = "sum") -> Tensor:
        """Reduce ``tensor`` in place across the group; every member gets the result. Returns it."""
        dist.all_reduce(tensor, op=self._convert_to_native_op(op), group=self.group)
        return tensor

    @override
    def reduce(self, tensor: Tensor, dst: int, op: str | _ReduceOp | Any = "sum") -> Tensor:
        """Reduce the group's ``tensor`` into global rank ``dst``'s (the others' are then unspecified); returns it."""
        dist.reduce(tensor, dst, op=self._convert_to_native_op(op), group=self.group)
        return tensor

    @override
    def all_gather(self, tensor_list: list[Tensor], tensor: Tensor) -> list[Tensor]:
        """Fill ``tensor_list[i]`` with the ``tensor`` of the group's rank ``i``, on every member; returns it."""
        dist.all_gather(tensor_list, tensor, group=self.group)
        return tensor_list

    @override
    def gather(self, tensor: Tensor, gather_list: list[Tensor], dst: int = 0) -> list[Tensor]:
        """Fill global rank ``dst``'s ``gather_list[i]`` with group rank ``i``'s ``tensor`` (the others pass
        ``[]``, as torch requires); returns ``gather_list``."""
        dist.gather(tensor=tensor, gather_list=gather_list, dst=dst, group=self.group)
        return gather_list

    @override
    def scatter(self, tensor: Tensor, scatter_list: list[Tensor], src: int = 0) -> Tensor:
        """Fill group rank ``i``'s ``tensor`` with global rank ``src``'s ``scatter_list[i]`` (the others pass
        ``[]``, as torch requires); returns ``tensor``."""
        dist.scatter(tensor=tensor, scatter_list=scatter_list, src=src, group=self.group)
        return tensor

    @override
    def reduce_scatter(self, output: Tensor, input_list: list[Tensor], op: str | _ReduceOp | Any = "sum") -> Tensor:
        """Reduce ``input_list[i]`` across the group into group rank ``i``'s ``output``; returns ``output``."""
        dist.reduce_scatter(output, input_list, op=self._convert_to_native_op(op), group=self.group)
        return output

    @override
    def all_to_all(self, output_tensor_list: list[Tensor], input_tensor_list: list[Tensor]) -> list[Tensor]:
        """Send ``input_tensor_list[j]`` to group rank ``j``, into its ``output_tensor_list[i]``; returns the latter."""
        dist.all_to_all(output_tensor_list, input_tensor_list, group=self.group)
        return output_tensor_list

    @override
    def send(self, tensor: Tensor, dst: int, tag: int = 0) -> None:
        """Send ``tensor`` to global rank ``dst``; blocks until it is received."""
        dist.send(tensor, dst, group=self.group, tag=tag)

    @override
    def recv(self, tensor: Tensor, src: int | None = None, tag: int = 0) -> Tensor:
        """Receive into ``tensor`` from global rank ``src`` (any rank when ``None``); returns it."""
        dist.recv(tensor, src, group=self.group, tag=tag)
        return tensor

    def all_gather_object(self, object_list: list[Any], obj: Any) -> list[Any]:
        """Fill ``object_list[i]`` (of the group's size) with group rank ``i``'s picklable ``obj``, on every member."""
        dist.all_gather_object(object_list, obj, group=self.group)
        return object_list

    def broadcast_object_list(self, object_list: list[Any], src: int, device: torch.device | None = None) -> list[Any]:
        """Overwrite every member's ``object_list`` (of the same length) with global rank ``src``'s; returns it."""
        dist.broadcast_object_list(object_list, src, group=self.group, device=device)
        return object_list

    def gather_object(self, obj: Any, object_gather_list: list[Any], dst: int = 0) -> list[Any]:
        """Fill global rank ``dst``'s ``object_gather_list`` (of the group's size) with every member's ``obj``; the
        others pass ``[]``."""
        dist.gather_object(obj=obj, object_gather_list=object_gather_list, dst=dst, group=self.group)
        return object_gather_list

    def scatter_object_list(
        self, scatter_object_output_list: list[Any], scatter_object_input_list: list[Any], src: int = 0
    ) -> list[Any]:
        """Set group rank ``i``'s ``scatter_object_output_list[0]`` to global rank ``src``'s
        ``scatter_object_input_list[i]`` (the others pass ``[]``)."""
        dist.scatter_object_list(
            scatter_object_output_list=scatter_object_output_list,
            scatter_object_input_list=scatter_object_input_list,
            src=src,
            group=self.group,
        )
        return scatter_object_output_list

    @override
    def barrier(self, device_ids: list[int] | None = None) -> None:
        """Wait for every member of the group; returns at once on a process outside it."""
        if self.group == dist.GroupMember.NON_GROUP_MEMBER:
            return
        dist.barrier(group=self.group, device_ids=device_ids)

    def monitored_barrier(self, timeout: datetime.timedelta | None = None, wait_all_ranks: bool = False) -> None:
        """A barrier that names the ranks that did not arrive within ``timeout`` (gloo only, as in torch)."""
        dist.monitored_barrier(group=self.group, timeout=timeout, wait_all_ranks=wait_all_ranks)

    # ------------------------------------------------------------------ groups
    @override
    def setup(self, main_address: str | None = None, main_port: str | int | None = None, **kwargs: Any) -> Self:
        """Create the default group unless it exists, rendezvousing at ``main_address:main_port`` (which fill
        ``MASTER_ADDR``/``MASTER_PORT`` where unset, for the rendezvous only); ``kwargs`` go to
        ``torch.distributed.init_process_group``. Returns ``self``."""
        if self.is_initialized():
            return self
        added = []
        for key, value in ((self.addr_key, main_address), (self.port_key, main_port)):
            if value is not None and key not in os.environ:
                os.environ[key] = str(value)
                added.append(key)
        try:
            super().setup(**kwargs)
        finally:
            for key in added:
                os.environ.pop(key, None)
        TorchCollective.manages_default_group = True
        return self

    @override
    def create_group(self, **kwargs: Any) -> Self:
        """Make this collective's group with ``torch.distributed.new_group(**kwargs)``, which every process of the
        default group must call with the same ``ranks``; returns ``self``. ``ValueError`` before :meth:`setup`,
        ``RuntimeError`` where this collective owns a group already."""
        try:
            return super().create_group(**kwargs)
        except ValueError as err:
            if self.is_initialized():
                raise
            raise ValueError(
                "TorchCollective.create_group() needs the default process group: call"
                " collective.setup(main_address=..., main_port=..., backend=..., world_size=..., rank=...) first"
                " (or torch.distributed.init_process_group)."
            ) from err

    @override
    def teardown(self) -> Self:
        """Destroy this collective's group, then the default group if :meth:`setup` created it and no other group
        is left; returns ``self``."""
        member = self.group != dist.GroupMember.NON_GROUP_MEMBER
        super().teardown()
        world = dist.GroupMember.WORLD
        if world is None:
            TorchCollective.manages_default_group = False
        elif member and TorchCollective.manages_default_group and len(dist.distributed_c10d._pg_map) == 1:
            # only members destroy it: an outsider racing ahead would tear the default group from under them
            self.destroy_group(world)
            TorchCollective.manages_default_group = False
        return self

    @classmethod
    @override
    def is_available(cls) -> bool:
        """Whether torch was built with ``torch.distributed``."""
        return dist.is_available()

    @classmethod
    @override
    def is_initialized(cls) -> bool:
        return cls.is_available() and dist.is_initialized()

    @classmethod
    @override
    def init_group(cls, **kwargs: Any) -> None:
        dist.init_process_group(**kwargs)

    @classmethod
    @override
    def new_group(cls, **kwargs: Any) -> Any:
        """``torch.distributed.new_group(**kwargs)``: every process of the default group must call it."""
        return dist.new_group(**kwargs)

    @classmethod
    @override
    def destroy_group(cls, group: Any) -> None:
        """Destroy ``group``; nothing happens when this process is not a member of it (or it is gone)."""
        if group in dist.distributed_c10d._pg_map:
            dist.destroy_process_group(group)

    @classmethod
    @override
    def _convert_to_native_op(cls, op: str | _ReduceOp | Any) -> Any:
        if isinstance(op, (_ReduceOp, _ReduceOp.RedOpType)):
            return op
        if not isinstance(op, str):
            raise ValueError(
                f"Unsupported op {op!r} of type {type(op).__name__}: pass a torch.distributed.ReduceOp or its name,"
                " e.g. op='sum'."
            )
        native = getattr(_ReduceOp, _OP_ALIASES.get(op.upper(), op.upper()), None)
        if native is None or not isinstance(native, _ReduceOp.RedOpType):
            raise ValueError(
                f"op {op.upper()!r} is not a member of `ReduceOp` (torch.distributed.ReduceOp): choose one of 'sum',"
                " 'product', 'min', 'max', 'band', 'bor', 'bxor', 'avg' (or 'mean')."
            )
        return native
