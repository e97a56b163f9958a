"""XLA devices (TPUs), never used: Lightning's XLA names exist at Lightning's paths so that code naming them
(``isinstance``, a registry listing, an import) keeps working; :meth:`XLAAccelerator.is_available` is ``False``, and
building any XLA object raises an error that says what is missing."""

from __future__ import annotations

from typing import Any, ClassVar, NoReturn

from typing_extensions import override

from fabric_lite.accelerators.accelerator import Accelerator
from fabric_lite.utilities.imports import _Availability
from fabric_lite.utilities.rank_zero import rank_zero_deprecation

_XLA_AVAILABLE = _Availability("torch_xla", "1.13")
_XLA_GREATER_EQUAL_2_1 = _Availability("torch_xla", "2.1")
_XLA_GREATER_EQUAL_2_5 = _Availability("torch_xla", "2.5")


def _xla_missing(what: str) -> NoReturn:
    """Raise the error every XLA name raises when it is used."""
    if not _XLA_AVAILABLE:
        raise ModuleNotFoundError(
            f"{what} needs torch_xla and an XLA device (a TPU): {_XLA_AVAILABLE}. fabric_lite itself computes on CPU,"
            " CUDA and MPS devices only; on a TPU, use Lightning Fabric."
        )
    raise NotImplementedError(
        f"{what}: fabric_lite computes on CPU, CUDA and MPS devices only, and has no XLA implementation (torch_xla is"
        " installed, but fabric_lite does not use it). On a TPU, use Lightning Fabric."
    )


def _using_pjrt() -> bool:
    """Whether XLA runs on its PJRT runtime (Lightning's check); always an error here."""
    _xla_missing("XLA's runtime")


class _NeedsXLA:
    """Mixed in first by every XLA class: building one raises :func:`_xla_missing`'s error before the base class's
    checks; the class stays usable in ``isinstance``, ``issubclass`` and ``Mock(spec=...)``."""

    #: for Lightning's former names of the XLA classes: the deprecation warned before the error (``{name}``: the
    #: class's name)
    _deprecated: ClassVar[str | None] = None

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        if cls._deprecated is not None:
            rank_zero_deprecation(cls._deprecated.format(name=cls.__name__))
        _xla_missing(cls.__name__)

    @classmethod
    def _check_choices(cls, *, label: str, **kwargs: Any) -> None:
        """The planner's check of a strategy name (``Fabric(strategy="xla")``): always the error."""
        _xla_missing(f"Fabric(strategy={label!r})")


class XLAAccelerator(_NeedsXLA, Accelerator):
    """Lightning Fabric's accelerator for XLA devices (TPUs): never available in fabric_lite.

    Example::

        XLAAccelerator.is_available()  # False
    """

    name = "tpu"

    @staticmethod
    @override
    def is_available() -> bool:
        return False

    @staticmethod
    @override
    def auto_device_count() -> int:
        return 0

    @staticmethod
    def parse_devices(devices: int | str | list[int]) -> NoReturn:
        _xla_missing("XLAAccelerator.parse_devices")

    @staticmethod
    def get_parallel_devices(devices: int | list[int]) -> NoReturn:
        _xla_missing("XLAAccelerator.get_parallel_devices")


__all__ = ["XLAAccelerator"]
