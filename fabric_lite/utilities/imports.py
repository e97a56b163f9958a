"""Platform flags, torch version flags and optional packages, under the names of Lightning Fabric's private
``utilities.imports`` (clients import them to gate features)."""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import platform
import sys
from typing import Any

import torch


def _version_tuple(text: str) -> tuple[int, ...]:
    """The leading numbers of a version: ``"2.13.0+cpu"`` -> ``(2, 13, 0)``, ``"2.6.0a0"`` -> ``(2, 6, 0)``."""
    parts = []
    for piece in text.split("."):
        digits = "".join(c for c in piece if c.isdigit())
        if not digits:
            break
        parts.append(int(digits))
    return tuple(parts)


class _Availability:
    """Whether ``package`` (at least ``min_version``) can be imported, checked on first use without importing it;
    ``str()`` says why not (Lightning uses ``RequirementCache``)."""

    def __init__(self, package: str, min_version: str | None = None, module: str | None = None) -> None:
        self.package = package
        self.min_version = min_version
        self.module = module or package.replace("-", "_")
        self._reason: str | None = None
        self._checked = False

    def _check(self) -> str | None:
        if not self._checked:
            self._checked = True
            try:
                spec = importlib.util.find_spec(self.module)
            except (ImportError, ValueError):  # a broken or half-imported package counts as missing
                spec = None
            if spec is None:
                self._reason = f"the package {self.package!r} is not installed: pip install {self.package}"
            elif self.min_version is not None:
                try:
                    found = importlib.metadata.version(self.package)
                except importlib.metadata.PackageNotFoundError:
                    found = "0"
                if _version_tuple(found) < _version_tuple(self.min_version):
                    self._reason = (
                        f"{self.package} {found} is installed, {self.min_version} or newer is needed:"
                        f" pip install '{self.package}>={self.min_version}'"
                    )
        return self._reason

    def __bool__(self) -> bool:
        return self._check() is None

    def __str__(self) -> str:
        reason = self._check()
        wanted = self.package + (f">={self.min_version}" if self.min_version else "")
        return f"Requirement {wanted!r} met" if reason is None else reason

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.package!r}{f', {self.min_version!r}' if self.min_version else ''})"


def _torch_at_least(version: str) -> bool:
    """Whether torch is at least ``version`` (a nightly or local build counts as its base version)."""
    return _version_tuple(torch.__version__.split("+")[0]) >= _version_tuple(version)


_NUMPY_AVAILABLE = _Availability("numpy")
_IS_WINDOWS = platform.system() == "Windows"
_IS_INTERACTIVE = hasattr(sys, "ps1") or bool(sys.flags.interactive)
_TORCH_GREATER_EQUAL_2_2 = _torch_at_least("2.2.0")
_TORCH_GREATER_EQUAL_2_3 = _torch_at_least("2.3.0")
_TORCH_EQUAL_2_4_0 = _version_tuple(torch.__version__.split("+")[0])[:3] == (2, 4, 0)
_TORCH_GREATER_EQUAL_2_4 = _torch_at_least("2.4.0")
_TORCH_GREATER_EQUAL_2_4_1 = _torch_at_least("2.4.1")
_TORCH_GREATER_EQUAL_2_5 = _torch_at_least("2.5.0")
_TORCH_GREATER_EQUAL_2_6 = _torch_at_least("2.6.0")
_TORCH_LESS_EQUAL_2_6 = _version_tuple(torch.__version__.split("+")[0])[:3] <= (2, 6, 0)
_TORCHMETRICS_GREATER_EQUAL_1_0_0 = _Availability("torchmetrics", "1.0.0")
_PYTHON_GREATER_EQUAL_3_10_0 = sys.version_info[:2] >= (3, 10)


#: how to install DeepSpeed for fabric_lite (its Python code only: the C++ ops compile on first use, see the README)
DEEPSPEED_INSTALL = "pip install 'fabric-lite[deepspeed]'"
#: torch >= 2.6 loads checkpoints with weights_only=True by default, which DeepSpeed handles from 0.16.0 on
_MIN_DEEPSPEED_FOR_TORCH_2_6 = (0, 16, 0)


def import_deepspeed(what: str = "strategy='deepspeed'") -> Any:
    """``deepspeed``, or an error that says how to install one that works with this torch (``what``: what needs it).

    Raises:
        ModuleNotFoundError: DeepSpeed is not installed, or misses a module; the message gives the install command.
        ImportError: the installed DeepSpeed does not work with this torch; the message names both versions.
    """
    try:
        version: str | None = importlib.metadata.version("deepspeed")
    except importlib.metadata.PackageNotFoundError:
        version = None
    too_old = version is not None and _version_tuple(version) < _MIN_DEEPSPEED_FOR_TORCH_2_6
    if too_old and _version_tuple(torch.__version__) >= (2, 6):
        raise ImportError(
            f"DeepSpeed {version} does not work with torch {torch.__version__}: torch >= 2.6 loads checkpoints"
            " with weights_only=True, which DeepSpeed supports from 0.16.0 on. Upgrade it:"
            f" pip install -U 'deepspeed>=0.16.0' (or {DEEPSPEED_INSTALL})."
        )
    try:
        return importlib.import_module("deepspeed")
    except ModuleNotFoundError as err:
        raise ModuleNotFoundError(
            f"{what} needs DeepSpeed, which this Python ({sys.executable}) cannot import"
            f" ({type(err).__name__}: {err}). Install it with:\n    DS_BUILD_OPS=0 {DEEPSPEED_INSTALL}\n"
            "(DS_BUILD_OPS=0: DeepSpeed's C++ ops are compiled on first use only, see the README's section"
            " 'DeepSpeed (optional)'; .ci/setup-deepspeed builds .venv-deepspeed this way.)"
        ) from err
    except Exception as err:  # DeepSpeed's import touches torch internals that move between releases
        raise ImportError(
            f"DeepSpeed {version or '(unknown version)'} cannot be imported with torch {torch.__version__}"
            f" ({type(err).__name__}: {err}). Install a DeepSpeed release made for this torch (pip install -U"
            " deepspeed), or the torch version this DeepSpeed was made for."
        ) from err
