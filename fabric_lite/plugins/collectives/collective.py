"""The collective interface: a process group of one's own and the calls that run on it."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

from torch import Tensor
from typing_extensions import Self

# re-exported: scripts import it from here, as from Lightning's module
from fabric_lite.utilities.types import CollectibleGroup

__all__ = ["CollectibleGroup", "Collective"]


class Collective(ABC):
    """Collective and point-to-point communication over a group that this object owns.

    :meth:`setup` joins the processes (creating the default group if needed); :meth:`create_group`, which every
    process of the default group must call, makes this object's group; :meth:`teardown` destroys it. Calls work in
    place, as in ``torch.distributed``, and return the tensor (or list) that holds the result.

    Example::

        collective = TorchCollective().setup(backend="gloo").create_group()  # on every rank
        collective.all_reduce(torch.tensor(rank + 1.0))  # tensor(3.) on rank 0 and rank 1
    """

    def __init__(self) -> None:
        self._group: Any = None

    @property
    @abstractmethod
    def rank(self) -> int:
        """This process's rank within the group."""

    @property
    @abstractmethod
    def world_size(self) -> int:
        """The number of processes in the group."""

    @property
    def group(self) -> Any:
        """The group the calls run on; ``RuntimeError`` before :meth:`create_group`."""
        if self._group is None:
            raise RuntimeError(
                f"`{type(self).__name__}` does not own a group yet: call collective.create_group() on every process"
                " first, then use collective.group."
            )
        return self._group

    @abstractmethod
    def broadcast(self, tensor: Tensor, src: int) -> Tensor:
        """Overwrite ``tensor`` on every process with rank ``src``'s."""

    @abstractmethod
    def all_reduce(self, tensor: Tensor, op: Any) -> Tensor:
        """Reduce ``tensor`` across the group in place; every process gets the result."""

    @abstractmethod
    def reduce(self, tensor: Tensor, dst: int, op: Any) -> Tensor:
        """Reduce ``tensor`` across the group into rank ``dst``'s ``tensor``."""

    @abstractmethod
    def all_gather(self, tensor_list: list[Tensor], tensor: Tensor) -> list[Tensor]:
        """Fill ``tensor_list[i]`` with rank ``i``'s ``tensor`` on every process."""

    @abstractmethod
    def gather(self, tensor: Tensor, gather_list: list[Tensor], dst: int = 0) -> list[Tensor]:
        """Fill rank ``dst``'s ``gather_list[i]`` with rank ``i``'s ``tensor``."""

    @abstractmethod
    def scatter(self, tensor: Tensor, scatter_list: list[Tensor], src: int = 0) -> Tensor:
        """Fill rank ``i``'s ``tensor`` with rank ``src``'s ``scatter_list[i]``."""

    @abstractmethod
    def reduce_scatter(self, output: Tensor, input_list: list[Tensor], op: Any) -> Tensor:
        """Reduce every process's ``input_list[i]`` into rank ``i``'s ``output``."""

    @abstractmethod
    def all_to_all(self, output_tensor_list: list[Tensor], input_tensor_list: list[Tensor]) -> list[Tensor]:
        """Send ``input_tensor_list[j]`` to rank ``j``, which receives it in ``output_tensor_list[i]``."""

    @abstractmethod
    def send(self, tensor: Tensor, dst: int, tag: int = 0) -> None:
        """Send ``tensor`` to rank ``dst`` (blocking)."""

    @abstractmethod
    def recv(self, tensor: Tensor, src: int | None = None, tag: int = 0) -> Tensor:
        """Receive into ``tensor`` from rank ``src`` (any rank when ``None``) and return it."""

    @abstractmethod
    def barrier(self, device_ids: list[int] | None = None) -> None:
        """Wait until every process of the group has entered the barrier."""

    @classmethod
    @abstractmethod
    def is_available(cls) -> bool:
        """Whether this kind of collective can run in this installation."""

    @classmethod
    @abstractmethod
    def is_initialized(cls) -> bool:
        """Whether the processes have joined (the default group exists)."""

    @classmethod
    @abstractmethod
    def init_group(cls, **kwargs: Any) -> None:
        """Create the default group (``kwargs`` as for the backend's initialisation)."""

    @classmethod
    @abstractmethod
    def new_group(cls, **kwargs: Any) -> Any:
        """Create and return a new group (``kwargs`` as for the backend's ``new_group``)."""

    @classmethod
    @abstractmethod
    def destroy_group(cls, group: Any) -> None:
        """Destroy ``group``; nothing happens for a group this process is not a member of."""

    @classmethod
    @abstractmethod
    def _convert_to_native_op(cls, op: Any) -> Any:
        """The backend's reduce operation for ``op`` (e.g. ``"sum"``)."""

    def setup(self, **kwargs: Any) -> Self:
        """Create the default group with ``kwargs`` unless it exists already; returns ``self``."""
        if not self.is_initialized():
            self.init_group(**kwargs)
        return self

    def create_group(self, **kwargs: Any) -> Self:
        """Make this collective's own group with :meth:`new_group` (``kwargs`` passed on); returns ``self``.
        ``RuntimeError`` where it owns one already (call :meth:`teardown` first)."""
        if self._group is not None:
            raise RuntimeError(
                f"`{type(self).__name__}` already owns a group: call collective.teardown() before creating another."
            )
        self._group = self.new_group(**kwargs)
        return self

    def teardown(self) -> Self:
        """Destroy the group made by :meth:`create_group`; returns ``self``, or raises ``RuntimeError`` without one."""
        if self._group is None:
            raise RuntimeError(f"`{type(self).__name__}` does not own a group to destroy: call create_group() first.")
        self.destroy_group(self._group)
        self._group = None
        return self
