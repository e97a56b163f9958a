"""The accelerator interface: what kind of device a process computes on."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from fabric_lite.accelerators.registry import _AcceleratorRegistry


class _Name(str):
    """An accelerator's name, readable both ways code reads it: as a string (``CPUAccelerator.name == "cpu"``, how
    fabric_lite declares it) and as a call (``CPUAccelerator.name()``, Lightning Fabric's static method)."""

    def __call__(self) -> str:
        return str(self)


def accelerator_name(cls: type[Accelerator] | Accelerator) -> str:
    """The name of an accelerator class or instance: its ``name`` attribute, or what its ``name()`` returns (the
    static method a custom accelerator written for Lightning Fabric defines)."""
    name = cls.name
    return str(name) if isinstance(name, str) else str(name())


def _undefined(method: str) -> NotImplementedError:
    """The error of a device method that an accelerator must define to be used by name in ``Fabric``."""
    return NotImplementedError(
        f"This accelerator does not define {method}(devices): define it as a static method (see CPUAccelerator)."
    )


class Accelerator(ABC):
    """A kind of device (CPU, CUDA GPU, Apple MPS). Subclasses are stateless.

    A custom accelerator may declare its name as a string (``name = "mine"``) or, as in Lightning Fabric, as a static
    method (``def name() -> str``); either reads both ways on the built-in accelerators.

    Example::

        CUDAAccelerator.is_available(), CUDAAccelerator.auto_device_count()  # (True, 8) on a machine with 8 GPUs
        CUDAAccelerator.parse_devices("0,2"), CUDAAccelerator.get_parallel_devices([0, 2])  # [0, 2], [cuda:0, cuda:2]
        fabric = Fabric(accelerator=CUDAAccelerator(), devices=2)  # the same as accelerator="cuda"
    """

    #: the name used in ``Fabric(accelerator=...)`` (also callable: ``CPUAccelerator.name()``)
    name: str = _Name("")

    def setup_device(self, device: torch.device) -> None:
        """Prepare ``device`` for use by this process (e.g. make it the current CUDA device)."""

    def teardown(self) -> None:
        """Release what :meth:`setup_device` acquired."""

    @staticmethod
    def parse_devices(devices: Any) -> Any:
        """``devices`` as this accelerator understands it (a count, a list of indices).

        Raises:
            NotImplementedError: the subclass does not say; it must define this to be used by name in ``Fabric``.
        """
        raise _undefined("parse_devices")

    @staticmethod
    def get_parallel_devices(devices: Any) -> Any:
        """The ``torch.device`` of each process for the parsed ``devices``.

        Raises:
            NotImplementedError: the subclass does not say; it must define this to be used by name in ``Fabric``.
        """
        raise _undefined("get_parallel_devices")

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
        name = accelerator_name(cls)
        if name:
            accelerator_registry.register(name, cls, description=cls.__name__)

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"
