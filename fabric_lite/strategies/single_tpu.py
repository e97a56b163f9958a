"""Lightning Fabric's former name of :class:`~fabric_lite.strategies.single_xla.SingleDeviceXLAStrategy`, at its
former path."""

from __future__ import annotations

from typing import Any

from fabric_lite.strategies.single_xla import SingleDeviceXLAStrategy
from fabric_lite.utilities.rank_zero import rank_zero_deprecation


class SingleTPUStrategy(SingleDeviceXLAStrategy):
    """Deprecated (Lightning's ``strategy="single_tpu"``, renamed ``"single_xla"``), and never available either:
    building one warns, then raises the XLA classes' error.

    Example::

        SingleTPUStrategy(0)  # LightningDeprecationWarning, then ModuleNotFoundError: ... needs torch_xla ...
    """

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        rank_zero_deprecation("The 'single_tpu' strategy is deprecated. Lightning renamed it 'single_xla'.")
        return super().__new__(cls, *args, **kwargs)


__all__ = ["SingleTPUStrategy"]
