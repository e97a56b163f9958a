"""Lightning's former name of ``SingleDeviceXLAStrategy``, at its former path."""

from __future__ import annotations

from typing import Any

from fabric_lite.strategies.single_xla import SingleDeviceXLAStrategy


class SingleTPUStrategy(SingleDeviceXLAStrategy):
    """Deprecated (Lightning's ``strategy="single_tpu"``, renamed ``"single_xla"``), and never available either:
    building one warns, then raises the XLA classes' error.

    Example::

        SingleTPUStrategy(0)  # LightningDeprecationWarning, then ModuleNotFoundError: ... needs torch_xla ...
    """

    _deprecated = "The 'single_tpu' strategy is deprecated. Lightning renamed it 'single_xla'."

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        """Any arguments, as in Lightning; building one raises (``__new__``)."""


__all__ = ["SingleTPUStrategy"]
