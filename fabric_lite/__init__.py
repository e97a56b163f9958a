"""fabric_lite: a small, fast, drop-in Lightning-Fabric-style accelerator API for hand-written PyTorch loops.
Importing it has no side effects; its names are imported on first use, so that the import hook
(:mod:`fabric_lite.as_lightning`, run at interpreter start-up) does not import torch."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fabric_lite.fabric import Fabric
    from fabric_lite.utilities.seed import seed_everything
    from fabric_lite.wrappers import is_wrapped

__version__ = "0.1.0"
__all__ = ["Fabric", "__version__", "is_wrapped", "seed_everything"]

_LAZY = {
    "Fabric": "fabric_lite.fabric",
    "seed_everything": "fabric_lite.utilities.seed",
    "is_wrapped": "fabric_lite.wrappers",
}


def _as_lightning_fabric() -> None:
    """The side effects of importing Lightning Fabric, run when the package is imported under Lightning's name
    (never by ``import fabric_lite``): ``PYTORCH_NVML_BASED_CUDA_CHECK=1`` unless set, so that forked processes can
    still use CUDA, and ``POSSIBLE_USER_WARNINGS=0`` (or ``off``) silences every ``PossibleUserWarning``."""
    import os

    os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")
    from fabric_lite.utilities.warnings import _disable_possible_user_warnings_if_asked

    _disable_possible_user_warnings_if_asked()


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value  # looked up once
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})
