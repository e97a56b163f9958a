"""The accelerator interface: what kind of device a process computes on."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from fabric_lite.accelerators.registry import _AcceleratorRegistry


class Accelerator(ABC):
    """A kind of device (CPU, CUDA GPU, Apple MPS). Subclasses are stateless.

    Example::

        CUDAAccelerator.is_available(), CUDAAccelerator.auto_device_count()  # (True, 8) on a machine with 8 GPUs
        fabric = Fabric(accelerator=CUDAAccelerator(), devices=2)  # the same as accelerator="cuda"
    """

    #: the name used in ``Fabric(accelerator=...)``
    name: str = ""

    def setup_device(self, device: torch.device) -> None:
        """Prepare ``device`` for use by this process (e.g. make it the current CUDA device)."""

    def teardown(self) -> None:
        """Release what :meth:`setup_device` acquired."""

    @staticmethod
    @abstractmethod
    def is_available() -> bool:
        """Whether this machine has this kind of device."""

    @staticmethod
    @abstractmethod
    def auto_device_count() -> int:
        """The number of devices ``devices="auto"`` selects."""

    @classmethod
    def register_accelerators(cls, accelerator_registry: _AcceleratorRegistry) -> None:
        """Add this class to ``accelerator_registry`` (the base class registers nothing; the built-in accelerators
        register themselves under their :attr:`name`)."""
        if cls.name:
            accelerator_registry.register(cls.name, cls, description=cls.__name__)

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"
