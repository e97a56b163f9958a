"""Type aliases and protocols shared across fabric_lite (Lightning Fabric's ``utilities.types``)."""

from __future__ import annotations

import enum
import os
from collections import defaultdict
from collections.abc import Callable
from typing import Any, Protocol, TypeAlias, TypeVar, Union, overload, runtime_checkable

import torch
from torch import Tensor

_PATH: TypeAlias = Union[str, "os.PathLike[str]"]
_DEVICE: TypeAlias = torch.device | str | int
#: what ``torch.load``'s ``map_location`` takes (Lightning's private name, imported by clients' load helpers)
_MAP_LOCATION_TYPE: TypeAlias = (
    _DEVICE | Callable[[torch.UntypedStorage, str], torch.UntypedStorage | None] | dict[_DEVICE, _DEVICE] | None
)
if torch.distributed.is_available():
    from torch.distributed import ProcessGroup as ProcessGroup
    from torch.distributed import ReduceOp as ReduceOp

    RedOpType: TypeAlias = ReduceOp.RedOpType
else:  # a build of torch without distributed support: importing fabric_lite must still work

    class _RedOpType(enum.Enum):
        """torch's reduce operations by name, for a torch without ``torch.distributed``."""

        SUM, AVG, PRODUCT, MIN, MAX, BAND, BOR, BXOR, PREMUL_SUM = range(9)

    class _ReduceOp:
        """A stand-in for ``torch.distributed.ReduceOp``: its members only."""

        RedOpType = _RedOpType
        SUM, AVG, PRODUCT, MIN, MAX = _RedOpType.SUM, _RedOpType.AVG, _RedOpType.PRODUCT, _RedOpType.MIN, _RedOpType.MAX
        BAND, BOR, BXOR, PREMUL_SUM = _RedOpType.BAND, _RedOpType.BOR, _RedOpType.BXOR, _RedOpType.PREMUL_SUM

    ReduceOp = _ReduceOp  # type: ignore[misc,assignment]
    RedOpType = _RedOpType  # type: ignore[misc,assignment]
    ProcessGroup = Any  # type: ignore[misc,assignment]
TBroadcast = TypeVar("TBroadcast")
TReduce = TypeVar("TReduce")


@runtime_checkable
class _Stateful(Protocol):
    """An object with ``state_dict()`` and ``load_state_dict(state)``."""

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state_dict: dict[str, Any]) -> None: ...


@runtime_checkable
class CollectibleGroup(Protocol):
    """A process group, structurally: ``size()`` and ``rank()``.

    Example::

        isinstance(torch.distributed.group.WORLD, CollectibleGroup)  # True once a process group exists
    """

    def size(self) -> int: ...

    def rank(self) -> int: ...


@runtime_checkable
class Steppable(Protocol):
    """Anything with an optimizer's ``step(closure=None)``.

    Example::

        isinstance(torch.optim.Adam(model.parameters()), Steppable)  # True
    """

    @overload
    def step(self, closure: None = ...) -> None: ...

    @overload
    def step(self, closure: Callable[[], float]) -> float: ...

    def step(self, closure: Callable[[], float] | None = ...) -> float | None: ...


@runtime_checkable
class Optimizable(Steppable, Protocol):
    """An optimizer, structurally: ``step``, ``param_groups``, ``defaults``, ``state`` and the state-dict methods.

    Example::

        isinstance(torch.optim.SGD(model.parameters(), lr=0.1), Optimizable)  # True
    """

    param_groups: list[dict[Any, Any]]
    defaults: dict[Any, Any]
    state: defaultdict[Tensor, Any]

    def state_dict(self) -> dict[str, dict[Any, Any]]: ...

    def load_state_dict(self, state_dict: dict[str, dict[Any, Any]]) -> None: ...
