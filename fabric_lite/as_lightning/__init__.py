"""Run code written against Lightning Fabric on fabric_lite, unmodified: an opt-in import hook.

With the hook on, ``lightning.fabric.*``, ``lightning_fabric.*``, ``lightning.Fabric`` and ``lightning.seed_everything``
are fabric_lite's, in this process and every Python process it starts; the rest of ``lightning`` stays the real package,
on the real Lightning Fabric (:mod:`fabric_lite.as_lightning._finder`). Turn it on with
``python -m fabric_lite.as_lightning`` (or ``fabric-lite run --as-lightning``), ``FABRIC_LITE_AS_LIGHTNING=1``, or
:func:`install`::

    python -m fabric_lite.as_lightning -m litgpt pretrain --config tiny.yaml
    FABRIC_LITE_AS_LIGHTNING=1 litgpt finetune_lora ...

Not covered: the ``lightning`` distribution's metadata, Lightning Fabric names fabric_lite lacks (``docs/migration.md``;
they raise ``ImportError``), and objects the real Lightning Fabric makes.
"""

from __future__ import annotations

import os
import sys

from fabric_lite.as_lightning._finder import LIGHTNING_VERSION, LightningFinder

#: "1" turns the hook on at start-up in every Python process of an environment where fabric_lite is installed
ENV_VAR = "FABRIC_LITE_AS_LIGHTNING"

__all__ = ["ENV_VAR", "LIGHTNING_VERSION", "install", "is_installed", "uninstall"]


def _finder() -> LightningFinder | None:
    return next((f for f in sys.meta_path if isinstance(f, LightningFinder)), None)


def is_installed() -> bool:
    """Whether the hook is on in this process.

    Example::

        fabric_lite.as_lightning.is_installed()  # True after install()
    """
    return _finder() is not None


def install(*, children: bool = True) -> None:
    """Turn the hook on in this process and, with ``children``, in every Python process it starts. Call it before
    anything imports Lightning; a second call does nothing.

    Raises:
        RuntimeError: Lightning Fabric was imported already (its modules cannot be swapped afterwards).

    Example::

        fabric_lite.as_lightning.install()
        import lightning as L  # L.Fabric is fabric_lite.fabric.Fabric
    """
    if children:
        os.environ[ENV_VAR] = "1"
    if is_installed():
        return
    early = sorted(
        name
        for name in ("lightning", "lightning.fabric", "lightning_fabric", "pytorch_lightning")
        if name in sys.modules
    )
    if early:
        raise RuntimeError(
            f"fabric_lite.as_lightning.install() came too late: {', '.join(early)} is imported already, so its"
            " modules are the real Lightning's. Call install() first thing in the program (before any import of"
            " lightning or of a library that imports it), or start it with `python -m fabric_lite.as_lightning"
            f" ...` or {ENV_VAR}=1."
        )
    sys.meta_path.insert(0, LightningFinder())


def uninstall() -> None:
    """Turn the hook off in this process and for the children it starts, and forget the modules it served, so that the
    next ``import lightning`` is the real one.

    Example::

        fabric_lite.as_lightning.uninstall()
    """
    os.environ.pop(ENV_VAR, None)
    finder = _finder()
    if finder is None:
        return
    sys.meta_path.remove(finder)
    for name in finder.names:
        sys.modules.pop(name, None)


def _install_from_environment() -> None:
    """What ``fabric_lite-as-lightning.pth`` runs at start-up when ``FABRIC_LITE_AS_LIGHTNING`` is set."""
    if os.environ.get(ENV_VAR, "").strip() not in ("", "0"):
        install()
