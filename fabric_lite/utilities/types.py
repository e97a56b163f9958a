"""Type aliases and protocols shared across fabric_lite (Lightning Fabric's ``utilities.types``).

Example::

    from fabric_lite.utilities.types import Optimizable, Steppable

    isinstance(torch.optim.SGD(model.parameters(), lr=0.1), Optimizable)  # True
"""

from __future__ import annotations

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
ReduceOp = torch.distributed.ReduceOp
if torch.distributed.is_available():
    from torch.distributed import ProcessGroup

    RedOpType: TypeAlias = ReduceOp.RedOpType
else:  # a build of torch without distributed support
    ProcessGroup = Any  # type: ignore[misc,assignment]
    RedOpType = object  # type: ignore[misc,assignment]
TBroadcast = TypeVar("TBroadcast")
TReduce = TypeVar("TReduce")


@runtime_checkable
class _Stateful(Protocol):
    """An object whose state can be saved and restored: ``state_dict()`` and ``load_state_dict(state)``."""

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state_dict: dict[str, Any]) -> None: ...


@runtime_checkable
class CollectibleGroup(Protocol):
    """A process group, structurally: it has ``size()`` and ``rank()``.

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
        isinstance(object(), Optimizable)                                     # False
    """

    param_groups: list[dict[Any, Any]]
    defaults: dict[Any, Any]
    state: defaultdict[Tensor, Any]

    def state_dict(self) -> dict[str, dict[Any, Any]]: ...

    def load_state_dict(self, state_dict: dict[str, dict[Any, Any]]) -> None: ...
