"""Warning categories (Lightning Fabric's ``utilities.warnings``).

Unlike Lightning's, importing it changes no warning format or filter, except what Lightning's documented
``POSSIBLE_USER_WARNINGS=0`` (or ``off``) asks for: every :class:`PossibleUserWarning` ignored.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping
from pathlib import Path

from fabric_lite.utilities.rank_zero import LightningDeprecationWarning


class PossibleUserWarning(UserWarning):
    """A warning about something that may be a mistake, or may be intended.

    Example::

        warnings.warn("the dataloader has 1 worker; this may be slow", PossibleUserWarning)
    """


def disable_possible_user_warnings(module: str = "") -> None:
    """Ignore :class:`PossibleUserWarning` from ``module`` (a regular expression matched against the start of the
    warning module's name), or from everywhere.

    Example::

        disable_possible_user_warnings("fabric_lite.strategies")
    """
    warnings.filterwarnings("ignore", module=module, category=PossibleUserWarning)


def _disable_possible_user_warnings_if_asked(environ: Mapping[str, str] | None = None) -> None:
    """Ignore every :class:`PossibleUserWarning` where ``POSSIBLE_USER_WARNINGS`` (in ``environ``, default
    ``os.environ``) is ``0`` or ``off``."""
    if (os.environ if environ is None else environ).get("POSSIBLE_USER_WARNINGS", "").lower() in ("0", "off"):
        disable_possible_user_warnings()


def _is_path_in_lightning(path: Path) -> bool:
    """Whether ``path``'s absolute form contains ``"lightning"`` (Lightning's private, naive helper, kept by name)."""
    return "lightning" in str(path.absolute())


_disable_possible_user_warnings_if_asked()  # the user's explicit request: a program that never sets it sees no change

__all__ = ["LightningDeprecationWarning", "PossibleUserWarning", "disable_possible_user_warnings"]
