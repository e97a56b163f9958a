"""Names of a package imported on first use (PEP 562), so that importing the package stays fast."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any


def lazy_getattr(package: str, lazy: dict[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` for ``package`` that imports ``lazy[name]`` when ``name`` is first asked for and
    returns that module's ``name``; any other name raises ``AttributeError``.

    Example::

        __getattr__ = lazy_getattr(__name__, {"FSDPStrategy": "fabric_lite.strategies.fsdp"})
    """

    def __getattr__(name: str) -> Any:
        if name in lazy:
            return getattr(importlib.import_module(lazy[name]), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__
