"""Build step (``pyproject.toml`` only): install ``fabric_lite-as-lightning.pth`` into site-packages. Python runs
it at every start-up; with ``FABRIC_LITE_AS_LIGHTNING`` set it turns on :mod:`fabric_lite.as_lightning`'s import
hook, for any command and every child process."""

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
