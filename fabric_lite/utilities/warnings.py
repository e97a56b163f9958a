"""Warning categories (Lightning Fabric's ``utilities.warnings``).

Unlike Lightning, importing this module changes no global warning filter and no ``warnings.formatwarning``:
:class:`LightningDeprecationWarning` follows Python's default filters for ``DeprecationWarning``.

Example::

    from fabric_lite.utilities.warnings import PossibleUserWarning, disable_possible_user_warnings

    disable_possible_user_warnings()  # silence the "this might be a mistake" warnings
"""

from __future__ import annotations

import warnings
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


def _is_path_in_lightning(path: Path) -> bool:
    """Whether ``path`` looks like a file of the Lightning package: its absolute form contains ``"lightning"``.

    Lightning's private helper for its ``warnings.formatwarning`` (which fabric_lite does not install), kept under its
    name for code that imports it. As Lightning's, it is naive: ``Path("/a/b/lightning")`` and any path under a
    folder named ``lightning`` count.
    """
    return "lightning" in str(path.absolute())


__all__ = ["LightningDeprecationWarning", "PossibleUserWarning", "disable_possible_user_warnings"]
