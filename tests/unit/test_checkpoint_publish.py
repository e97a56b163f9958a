"""Publishing a sharded checkpoint folder over the previous one leaves no moment without a complete checkpoint at
the target: on Linux the two are exchanged in one step (``renameat2``), elsewhere the previous one is renamed
aside first (``fabric_lite.runtime.checkpoint.folders.publish_folder``)."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest

from fabric_lite.runtime.checkpoint import folders


def _folder(path: Path, content: str) -> Path:
    path.mkdir()
    (path / ".metadata").write_text(content)
    return path


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="renameat2 is Linux's")
@pytest.mark.parametrize("previous", ["folder", "file"])
def test_the_new_folder_takes_the_previous_ones_place_in_one_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, previous: str
) -> None:
    target = tmp_path / "ckpt"
    if previous == "folder":
        _folder(target, "old")
    else:
        target.write_text("an earlier single-file checkpoint")
    temp = _folder(tmp_path / ".ckpt.tmp", "new")

    def no_rename(*args: Any) -> None:
        raise AssertionError("the target was renamed away: a moment without a checkpoint")

    monkeypatch.setattr(os, "replace", no_rename)
    folders.publish_folder(temp, target)
    assert (target / ".metadata").read_text() == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]  # the previous one and the temp name are gone


def test_without_an_exchange_the_previous_one_is_set_aside_then_removed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(folders, "_exchange", lambda a, b: False)
    target = _folder(tmp_path / "ckpt", "old")
    folders.publish_folder(_folder(tmp_path / ".ckpt.tmp", "new"), target)
    assert (target / ".metadata").read_text() == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]


def test_a_first_folder_is_renamed_into_place(tmp_path: Path) -> None:
    folders.publish_folder(_folder(tmp_path / ".ckpt.tmp", "new"), tmp_path / "ckpt")
    assert (tmp_path / "ckpt" / ".metadata").read_text() == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]


def test_an_exchange_that_fails_names_the_path(tmp_path: Path) -> None:
    with pytest.raises(OSError, match="missing"):
        folders._exchange(tmp_path / "absent", tmp_path / "missing")
