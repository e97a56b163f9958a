"""Code health, part of the test command CI runs: ``mypy --strict`` on the package, ``ruff`` lint and format check.

Both tools come with the ``test`` extra (``.ci/setup`` installs it); a venv without them fails here, saying how to
install them, rather than skipping.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CHECKED = ["fabric_lite", "tests", "examples", "benchmarks", "docs"]


def _tool(name: str) -> str:
    found = Path(sys.executable).with_name(name)
    if found.exists():
        return str(found)
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} is not installed in this venv: run .ci/setup (it installs the `test` extra).")
    return path


def _run(argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=300)


@pytest.mark.timeout(300)
def test_mypy_strict_is_clean():
    done = _run([_tool("mypy")])  # strict, on fabric_lite/ (pyproject's [tool.mypy])
    assert done.returncode == 0, done.stdout + done.stderr


def test_ruff_lint_is_clean():
    done = _run([_tool("ruff"), "check", *CHECKED])
    assert done.returncode == 0, done.stdout + done.stderr


def test_ruff_format_is_clean():
    done = _run([_tool("ruff"), "format", "--check", *CHECKED])
    assert done.returncode == 0, done.stdout + done.stderr
