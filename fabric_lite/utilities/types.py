"""Type aliases shared across fabric_lite."""

from __future__ import annotations

import os
from typing import Any, Protocol, TypeAlias, TypeVar, Union, runtime_checkable

import torch

_PATH: TypeAlias = Union[str, "os.PathLike[str]"]
_DEVICE: TypeAlias = torch.device | str | int
ReduceOp = torch.distributed.ReduceOp
TBroadcast = TypeVar("TBroadcast")
TReduce = TypeVar("TReduce")


@runtime_checkable
class _Stateful(Protocol):
    """An object whose state can be saved and restored: ``state_dict()`` and ``load_state_dict(state)``."""

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state_dict: dict[str, Any]) -> None: ...
