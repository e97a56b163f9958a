"""The collective of a single process: every call is an identity."""

from __future__ import annotations

from typing import Any

from torch import Tensor
from typing_extensions import override

from fabric_lite.plugins.collectives.collective import Collective


class SingleDeviceCollective(Collective):
    """Collectives for one process, ``rank`` 0 of ``world_size`` 1: every call returns its input (or rank 0's part of
    it), so code written against :class:`Collective` runs without ``torch.distributed``.

    Example::

        SingleDeviceCollective().create_group().all_reduce(torch.tensor(3.0), op="sum")  # tensor(3.)
    """

    @property
    @override
    def rank(self) -> int:
        """Always 0."""
        return 0

    @property
    @override
    def world_size(self) -> int:
        """Always 1."""
        return 1

    @override
    def broadcast(self, tensor: Tensor, *_: Any, **__: Any) -> Tensor:
        return tensor

    @override
    def all_reduce(self, tensor: Tensor, *_: Any, **__: Any) -> Tensor:
        return tensor

    @override
    def reduce(self, tensor: Tensor, *_: Any, **__: Any) -> Tensor:
        return tensor

    @override
    def all_gather(self, tensor_list: list[Tensor], tensor: Tensor, **__: Any) -> list[Tensor]:
        """``[tensor]``."""
        return [tensor]

    @override
    def gather(self, tensor: Tensor, *_: Any, **__: Any) -> list[Tensor]:
        """``[tensor]``."""
        return [tensor]

    @override
    def scatter(self, tensor: Tensor, scatter_list: list[Tensor], *_: Any, **__: Any) -> Tensor:
        """``scatter_list[0]``: the part for rank 0."""
        return scatter_list[0]

    @override
    def reduce_scatter(self, output: Tensor, input_list: list[Tensor], *_: Any, **__: Any) -> Tensor:
        """``input_list[0]``: the part for rank 0."""
        return input_list[0]

    @override
    def all_to_all(
        self, output_tensor_list: list[Tensor], input_tensor_list: list[Tensor], *_: Any, **__: Any
    ) -> list[Tensor]:
        """``input_tensor_list``."""
        return input_tensor_list

    @override
    def send(self, *_: Any, **__: Any) -> None:
        """Nothing to send to."""

    @override
    def recv(self, tensor: Tensor, *_: Any, **__: Any) -> Tensor:
        return tensor

    @override
    def barrier(self, *_: Any, **__: Any) -> None:
        """Nothing to wait for."""

    @classmethod
    @override
    def is_available(cls) -> bool:
        """Always ``True``."""
        return True

    @classmethod
    @override
    def is_initialized(cls) -> bool:
        """Always ``True``: one process has nothing to join."""
        return True

    @classmethod
    @override
    def init_group(cls, **_: Any) -> None:
        """Nothing to create."""

    @classmethod
    @override
    def new_group(cls, **_: Any) -> Any:
        """A placeholder group (a plain ``object()``)."""
        return object()

    @classmethod
    @override
    def destroy_group(cls, group: Any) -> None:
        """Nothing to destroy."""

    @classmethod
    @override
    def _convert_to_native_op(cls, op: str) -> str:
        return op
