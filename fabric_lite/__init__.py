"""fabric_lite: a small, fast, drop-in Lightning-Fabric-style accelerator API for hand-written PyTorch loops.

Importing it has no side effects: no environment variables are written, no logging handler is added and no
optional backend (``torch._dynamo``, FSDP, tensorboard) is imported. The names below are imported on first use,
so that ``import fabric_lite.as_lightning`` (run at interpreter start-up when the Lightning import hook is on) does
not import torch.
"""

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
    """What executing the package under Lightning's name (``lightning.fabric``, ``lightning_fabric``, through the
    import hook) does beyond giving its names, as importing Lightning Fabric does; ``import fabric_lite`` never runs it.

    * ``PYTORCH_NVML_BASED_CUDA_CHECK=1`` unless the variable is set already: ``torch.cuda.is_available()`` then
      asks NVML instead of initialising the CUDA driver, so processes forked later (``ddp_fork``,
      ``ddp_notebook``, data loader workers) can still use CUDA;
    * ``POSSIBLE_USER_WARNINGS=0`` (or ``off``) ignores every ``PossibleUserWarning``.
    """
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
