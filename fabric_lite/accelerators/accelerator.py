"""The accelerator interface: what kind of device a process computes on."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from fabric_lite.accelerators.registry import _AcceleratorRegistry


class _Name(str):
    """An accelerator's name, read as a string (``name == "cpu"``) or called (``name()``, Lightning's static method)."""

    def __call__(self) -> str:
        return str(self)


def accelerator_name(cls: type[Accelerator] | Accelerator) -> str:
    """The name of an accelerator class or instance, declared as a string or as Lightning's static ``name()``."""
    name = cls.name
    return str(name) if isinstance(name, str) else str(name())


def _undefined(method: str) -> NotImplementedError:
    """The error of a device method that an accelerator must define to be used by name in ``Fabric``."""
    return NotImplementedError(
        f"This accelerator does not define {method}(devices): define it as a static method (see CPUAccelerator)."
    )


class Accelerator(ABC):
    """A kind of device (CPU, CUDA GPU, Apple MPS); subclasses are stateless. A custom one declares its name as a
    string (``name = "mine"``) or, as in Lightning, a static method; the built-in names read both ways.

    Example::

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
        """``devices`` as this accelerator understands it; ``NotImplementedError`` where the subclass does not say."""
        raise _undefined("parse_devices")

    @staticmethod
    def get_parallel_devices(devices: Any) -> Any:
        """The ``torch.device`` of each process for the parsed ``devices``; ``NotImplementedError`` as above."""
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
        """Register this class under its :attr:`name` (the base class, which has none, registers nothing)."""
        name = accelerator_name(cls)
        if name:
            accelerator_registry.register(name, cls, description=cls.__name__)

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"
