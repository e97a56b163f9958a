"""``Fabric(accelerator=NAME)`` with a name a user registered in ``ACCELERATOR_REGISTRY``, as in Lightning Fabric."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from fabric_lite import Fabric
from fabric_lite.accelerators import ACCELERATOR_REGISTRY, Accelerator, CPUAccelerator


class CountingCPU(CPUAccelerator):
    """A CPU accelerator with a constructor argument and a hook that records the devices it was given."""

    def __init__(self, label: str) -> None:
        self.label = label
        self.devices: list[torch.device] = []

    def setup_device(self, device: torch.device) -> None:
        self.devices.append(device)
        super().setup_device(device)


class Elsewhere(Accelerator):
    """A device kind fabric_lite cannot run on."""

    @staticmethod
    def is_available() -> bool:
        return True

    @staticmethod
    def auto_device_count() -> int:
        return 1


@pytest.fixture
def registered() -> Iterator[None]:
    ACCELERATOR_REGISTRY.register("counting_cpu", CountingCPU, description="test", label="from the registry")
    ACCELERATOR_REGISTRY.register("elsewhere", Elsewhere)
    try:
        yield
    finally:
        ACCELERATOR_REGISTRY.remove("counting_cpu")
        ACCELERATOR_REGISTRY.remove("elsewhere")


def test_a_registered_name_builds_the_registered_class_with_its_arguments(registered: None) -> None:
    fabric = Fabric(accelerator="counting_cpu", devices=1)
    assert type(fabric.accelerator) is CountingCPU
    assert fabric.accelerator.label == "from the registry"
    assert fabric.device == torch.device("cpu")
    fabric.launch()
    assert fabric.accelerator.devices == [torch.device("cpu")]  # the strategy used this instance
    model = fabric.setup(torch.nn.Linear(2, 1))
    assert model(torch.ones(1, 2)).shape == (1, 1)


def test_a_registered_class_of_an_unknown_device_kind_is_refused_by_name(registered: None) -> None:
    with pytest.raises(ValueError, match=r"accelerator='elsewhere'.*'Elsewhere'.*subclass CPUAccelerator"):
        Fabric(accelerator="elsewhere", devices=1)


def test_an_unknown_name_lists_the_registered_ones(registered: None) -> None:
    with pytest.raises(ValueError, match=r"accelerator='nowhere'.*registered in ACCELERATOR_REGISTRY.*'counting_cpu'"):
        Fabric(accelerator="nowhere", devices=1)


def test_built_in_names_still_build_the_built_in_classes() -> None:
    assert type(Fabric(accelerator="cpu", devices=1).accelerator) is CPUAccelerator
    assert ACCELERATOR_REGISTRY.available_accelerators() >= {"cpu", "cuda", "mps"}
