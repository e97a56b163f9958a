"""Warning categories (Lightning Fabric's ``utilities.warnings``).

Unlike Lightning, importing this module changes no ``warnings.formatwarning`` and no filter of its own:
:class:`LightningDeprecationWarning` follows Python's default filters for ``DeprecationWarning``. The one filter it
adds is the one a user asks for with Lightning's documented variable ``POSSIBLE_USER_WARNINGS=0`` (or ``off``): every
:class:`PossibleUserWarning` ignored, as :func:`disable_possible_user_warnings` does.

Example::

    from fabric_lite.utilities.warnings import PossibleUserWarning, disable_possible_user_warnings

    disable_possible_user_warnings()  # silence the "this might be a mistake" warnings
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping
from pathlib import Path

from fabric_lite.utilities.rank_zero import LightningDeprecationWarning


class PossibleUserWarning(UserWarning):
    """A warning about something that may be a mistake, or may be intended (a possible false positive).

    Example::

        warnings.warn("the dataloader has 1 worker; this may be slow", PossibleUserWarning)
    """


def disable_possible_user_warnings(module: str = "") -> None:
    """Ignore :class:`PossibleUserWarning` from ``module`` (a regular expression matched against the start of the
    module name that warns), or from everywhere when ``module`` is ``""``.

    For finer control use :func:`warnings.filterwarnings` directly.

    Example::

        disable_possible_user_warnings()                          # everywhere
        disable_possible_user_warnings("fabric_lite.strategies")  # only from the strategies
    """
    warnings.filterwarnings("ignore", module=module, category=PossibleUserWarning)


def _disable_possible_user_warnings_if_asked(environ: Mapping[str, str] | None = None) -> None:
    """Ignore every :class:`PossibleUserWarning` where ``POSSIBLE_USER_WARNINGS`` (in ``environ``, default
    ``os.environ``) is ``0`` or ``off``, Lightning's documented switch; otherwise do nothing."""
    if (os.environ if environ is None else environ).get("POSSIBLE_USER_WARNINGS", "").lower() in ("0", "off"):
        disable_possible_user_warnings()


def _is_path_in_lightning(path: Path) -> bool:
    """Whether ``path`` looks like a file of the Lightning package: its absolute form contains ``"lightning"``.

    Lightning's private helper for its ``warnings.formatwarning`` (which fabric_lite does not install), kept under its
    name for code that imports it. As Lightning's, it is naive: ``Path("/a/b/lightning")`` and any path under a
    folder named ``lightning`` count.
    """
    return "lightning" in str(path.absolute())


_disable_possible_user_warnings_if_asked()  # the user's explicit request: a program that never sets it sees no change

__all__ = ["LightningDeprecationWarning", "PossibleUserWarning", "disable_possible_user_warnings"]
