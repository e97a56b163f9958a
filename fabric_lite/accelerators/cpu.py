"""The CPU accelerator."""

from __future__ import annotations

import torch
from typing_extensions import override

from fabric_lite.accelerators.accelerator import Accelerator, _Name


class CPUAccelerator(Accelerator):
    """Compute on the CPU: ``devices=N`` means N processes.

    Example::

        fabric = Fabric(accelerator="cpu", devices=2, strategy="ddp")  # two processes, gloo between them
    """

    name = _Name("cpu")

    @override
    def setup_device(self, device: torch.device) -> None:
        """Check that ``device`` is a CPU device (``ValueError`` otherwise); nothing to prepare."""
        if device.type != "cpu":
            raise ValueError(
                f"Device should be CPU, got {device} instead: CPUAccelerator computes on torch.device('cpu')."
            )

    @staticmethod
    @override
    def parse_devices(devices: int | str) -> int:
        """The number of processes ``devices`` asks for (see :func:`_parse_cpu_cores`)."""
        return _parse_cpu_cores(devices)

    @staticmethod
    @override
    def get_parallel_devices(devices: int | str) -> list[torch.device]:
        """One CPU device per process."""
        return [torch.device("cpu")] * _parse_cpu_cores(devices)

    @staticmethod
    @override
    def is_available() -> bool:
        return True

    @staticmethod
    @override
    def auto_device_count() -> int:
        return 1


def _parse_cpu_cores(cpu_cores: int | str) -> int:
    """The number of processes ``cpu_cores`` asks for: an int > 0 or a string of digits; ``TypeError`` for anything
    else (a bool, -1, 0)."""
    value: object = cpu_cores
    if isinstance(cpu_cores, str) and cpu_cores.strip().isascii() and cpu_cores.strip().isdigit():
        value = int(cpu_cores)
    if type(value) is not int or value <= 0:
        raise TypeError(
            f"`devices` selected with `CPUAccelerator` should be an int > 0 (the number of processes), got"
            f" {cpu_cores!r}."
        )
    return value
