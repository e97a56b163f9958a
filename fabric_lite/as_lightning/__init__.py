"""Run code written against Lightning Fabric on fabric_lite, unmodified: an opt-in import hook.

With the hook on, ``lightning.fabric.*``, ``lightning_fabric.*`` and the Fabric names of the top-level ``lightning``
package (``lightning.Fabric``, ``lightning.seed_everything``) are fabric_lite's, in this process and in every
Python process it starts (the launchers' children, torchrun's workers, ``subprocess.run([sys.executable, ...])``).
``lightning.pytorch`` and the rest of Lightning stay the real package when it is installed, still running on the
real Lightning Fabric underneath (see :mod:`fabric_lite.as_lightning._finder`); without it, ``lightning`` holds
only the Fabric names. A library such as litgpt, which imports ``lightning`` in dozens of modules, then runs on
fabric_lite without an edit.

Three ways to turn it on, each inherited by child processes:

* the command line::

      python -m fabric_lite.as_lightning -m litgpt pretrain --config tiny.yaml   # a module, like python -m
      python -m fabric_lite.as_lightning train.py --lr 0.1                       # a script
      fabric-lite run --as-lightning --devices 2 -m litgpt pretrain ...          # under fabric-lite run

* the environment variable ``FABRIC_LITE_AS_LIGHTNING=1`` (read at interpreter start-up by the
  ``fabric_lite-as-lightning.pth`` file that installing fabric_lite puts in site-packages)::

      FABRIC_LITE_AS_LIGHTNING=1 litgpt finetune_lora ...

* one line of Python, before anything imports Lightning::

      import fabric_lite.as_lightning; fabric_lite.as_lightning.install()

What it does not cover: code that reads the ``lightning`` *distribution's* metadata (``importlib.metadata``,
``RequirementCache("lightning>=2.5")``) sees what is installed, not fabric_lite; the Lightning Fabric names
fabric_lite does not provide (``docs/migration.md`` lists them) raise ``ImportError`` naming them; objects of the
real Lightning Fabric (made by ``lightning.pytorch``'s internals) are not fabric_lite's.
"""

from __future__ import annotations

import os
import sys

from fabric_lite.as_lightning._finder import LIGHTNING_VERSION, LightningFinder

#: "1" turns the hook on at start-up in every Python process of an environment where fabric_lite is installed
ENV_VAR = "FABRIC_LITE_AS_LIGHTNING"

__all__ = ["ENV_VAR", "LIGHTNING_VERSION", "install", "is_installed", "uninstall"]


def _enabled(value: str | None) -> bool:
    return (value or "").strip() not in ("", "0")


def _finder() -> LightningFinder | None:
    return next((f for f in sys.meta_path if isinstance(f, LightningFinder)), None)


def is_installed() -> bool:
    """Whether the hook is on in this process.

    Example::

        fabric_lite.as_lightning.install()
        fabric_lite.as_lightning.is_installed()  # True
    """
    return _finder() is not None


def install(*, children: bool = True) -> None:
    """Turn the hook on in this process (and, with ``children=True``, in every Python process it starts, through
    ``FABRIC_LITE_AS_LIGHTNING=1``). Call it before anything imports Lightning; calling it again does nothing.

    Raises:
        RuntimeError: Lightning Fabric was imported already (its modules cannot be swapped afterwards).

    Example::

        import fabric_lite.as_lightning

        fabric_lite.as_lightning.install()
        import lightning as L

        L.Fabric  # fabric_lite.fabric.Fabric
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
    """Turn the hook off in this process (and for the children it starts from now on), and forget every module it
    served, so that the next ``import lightning`` is the real one (or fails, where Lightning is not installed).

    Example::

        fabric_lite.as_lightning.uninstall()
        fabric_lite.as_lightning.is_installed()  # False
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
    if _enabled(os.environ.get(ENV_VAR)):
        install()
