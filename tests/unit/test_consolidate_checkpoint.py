"""The consolidate command's argument checks at Lightning Fabric's module path
(``fabric_lite.utilities.consolidate_checkpoint``: ``_parse_cli_args``, ``_process_cli_args``), in one process.

Consolidating real sharded checkpoints is in tests/distributed/test_cli.py, test_fsdp.py and test_remote.py.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from pathlib import Path

import pytest

import fabric_lite.utilities as utilities
from fabric_lite.utilities.consolidate_checkpoint import _parse_cli_args, _process_cli_args

LOGGER = "fabric_lite.utilities.consolidate_checkpoint"
cli_module = importlib.import_module(LOGGER)  # the module: the package's attribute of that name is also a function


def _exits_with(args: argparse.Namespace, caplog: pytest.LogCaptureFixture) -> str:
    caplog.clear()
    with caplog.at_level(logging.ERROR, logger=LOGGER), pytest.raises(SystemExit) as exit_info:
        _process_cli_args(args)
    assert exit_info.value.code == 1
    return caplog.text


def test_parse_cli_args_reads_the_folder_and_the_output_file(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "argv", ["consolidate_checkpoint.py", "ckpt"])
    assert vars(_parse_cli_args()) == {"checkpoint_folder": "ckpt", "output_file": None}
    monkeypatch.setattr(sys, "argv", ["consolidate_checkpoint.py", "ckpt", "--output_file", "out.pt"])
    assert vars(_parse_cli_args()) == {"checkpoint_folder": "ckpt", "output_file": "out.pt"}


def test_process_cli_args_logs_each_problem_with_the_path_and_exits(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    missing = tmp_path / "nope"
    assert f"The provided checkpoint folder does not exist: {missing}" in _exits_with(
        argparse.Namespace(checkpoint_folder=missing), caplog
    )
    plain = tmp_path / "full.ckpt"
    plain.write_bytes(b"")
    text = _exits_with(argparse.Namespace(checkpoint_folder=plain), caplog)
    assert "checkpoint path must be a folder" in text and "is a file (a full checkpoint" in text
    other = tmp_path / "notes"
    other.mkdir()
    (other / "readme.txt").write_text("hi")
    text = _exits_with(argparse.Namespace(checkpoint_folder=other), caplog)
    assert "Only FSDP-sharded checkpoints saved with Lightning are supported" in text and "readme.txt" in text
    monkeypatch.setattr(cli_module, "_TORCH_GREATER_EQUAL_2_3", False)
    assert "requires PyTorch >= 2.3." in _exits_with(argparse.Namespace(), caplog)


@pytest.mark.parametrize("marker", ["meta.pt", ".metadata", "checkpoint/"])
def test_process_cli_args_accepts_lightnings_dcp_and_deepspeed_folders(
    marker: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    folder = tmp_path / "step.100"
    (folder / marker).parent.mkdir(parents=True, exist_ok=True)
    if marker.endswith("/"):
        (folder / marker).mkdir()
    else:
        (folder / marker).touch()
    config = _process_cli_args(argparse.Namespace(checkpoint_folder=str(folder), output_file=None))
    assert vars(config) == {"checkpoint_folder": folder, "output_file": tmp_path / "step.100.consolidated"}
    taken = tmp_path / "taken.pt"
    taken.touch()
    text = _exits_with(argparse.Namespace(checkpoint_folder=folder, output_file=taken), caplog)
    assert f"The path for the converted checkpoint already exists: {taken}" in text and "--output_file" in text


def test_a_url_is_checked_when_it_is_read(tmp_path: Path) -> None:
    config = _process_cli_args(argparse.Namespace(checkpoint_folder="memory://run/step-1/", output_file=None))
    assert vars(config) == {
        "checkpoint_folder": "memory://run/step-1",
        "output_file": "memory://run/step-1.consolidated",
    }


def test_the_package_function_stays_callable_once_the_module_is_imported(tmp_path: Path) -> None:
    # importing the module puts it where the package had the function of the same name
    assert utilities.consolidate_checkpoint is cli_module
    with pytest.raises(FileNotFoundError, match="Checkpoint not found"):
        utilities.consolidate_checkpoint(tmp_path / "nope", tmp_path / "out.pt")
