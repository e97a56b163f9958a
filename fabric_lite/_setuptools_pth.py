"""Build step (used by ``pyproject.toml`` only): install ``fabric_lite-as-lightning.pth`` into site-packages.

Python runs that one-line file at every start-up; it does nothing unless ``FABRIC_LITE_AS_LIGHTNING`` is set, and
then turns on :mod:`fabric_lite.as_lightning`'s import hook, so that the variable works for any command
(``FABRIC_LITE_AS_LIGHTNING=1 litgpt pretrain ...``) and for every child process. A regular install takes the file
from the build folder; an editable install (``pip install -e .``) from the wheel's own folder, where setuptools
writes what is not part of the source tree. ``pip uninstall`` removes it with the rest.
"""

from __future__ import annotations

import os

from setuptools.command.build_py import build_py  # type: ignore[import-untyped]

PTH_FILE = "fabric_lite-as-lightning.pth"
_SOURCE = os.path.join(os.path.dirname(__file__), "as_lightning", PTH_FILE)


class BuildPyWithPth(build_py):  # type: ignore[misc]
    """``build_py`` that also puts :data:`PTH_FILE` at the top of the wheel (site-packages once installed)."""

    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):
            target = self.distribution.get_command_obj("install").install_lib
        else:
            target = self.build_lib
        self.copy_file(_SOURCE, os.path.join(target, PTH_FILE))
