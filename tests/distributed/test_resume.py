"""Resuming from a checkpoint gives exactly the weights of a run that never stopped (RELIABILITY cases 7 and 21).

The checkpoint holds the model, the optimizer, every process's random generators (``RandomState``) and the
dataloader's epoch, so that dropout masks and the shuffling order continue as if nothing happened.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from tests.helpers.harness import run_python

pytestmark = pytest.mark.distributed
SCRIPT = "tests/helpers/scripts/resume_train.py"


def final_weights(path: Path) -> dict[str, torch.Tensor]:
    return torch.load(path, weights_only=True)  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> dict[str, torch.Tensor]:
    folder = tmp_path_factory.mktemp("uninterrupted")
    done = run_python([SCRIPT, "--out", str(folder / "final.pt"), "--checkpoint", str(folder / "last.ckpt")], 120)
    assert done.returncode == 0, done.output
    return final_weights(folder / "final.pt")


@pytest.fixture(scope="module")
def stopped(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The checkpoint of a run stopped after its first epoch, saved by the script itself (``last.ckpt``)."""
    folder = tmp_path_factory.mktemp("stopped")
    done = run_python([SCRIPT, "--out", str(folder / "final.pt"), "--checkpoint", str(folder / "last.ckpt"),
                       "--stop-after", "0"], 120)  # fmt: skip
    assert done.returncode == 0, done.output
    assert not (folder / "final.pt").exists()
    return folder / "last.ckpt"


def assert_same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key


def test_stop_and_resume_ends_with_identical_weights(uninterrupted, stopped: Path, tmp_path: Path) -> None:
    args = ["--out", str(tmp_path / "final.pt"), "--checkpoint", str(tmp_path / "last.ckpt")]
    shutil.copy(stopped, tmp_path / "last.ckpt")
    second = run_python([SCRIPT, *args], 120)
    assert second.returncode == 0, second.output
    assert_same(final_weights(tmp_path / "final.pt"), uninterrupted)


def test_without_the_random_state_the_resumed_run_differs(uninterrupted, stopped: Path, tmp_path: Path) -> None:
    """The control: the checkpoint really is what makes the runs identical (dropout draws random numbers)."""
    args = ["--out", str(tmp_path / "final.pt"), "--checkpoint", str(tmp_path / "last.ckpt")]
    checkpoint = torch.load(stopped, weights_only=True)
    del checkpoint["rng"]
    torch.save(checkpoint, tmp_path / "last.ckpt")
    script = Path(SCRIPT).read_text().replace('"rng": RandomState(), ', "")
    (tmp_path / "no_rng.py").write_text(script)
    done = run_python([str(tmp_path / "no_rng.py"), *args], 120)
    assert done.returncode == 0, done.output
    resumed = final_weights(tmp_path / "final.pt")
    assert any(not torch.equal(resumed[k], uninterrupted[k]) for k in resumed)


@pytest.mark.timeout(300)
def test_torchrun_restart_after_a_killed_rank_resumes_to_identical_weights(uninterrupted, tmp_path: Path) -> None:
    done = run_python(
        [
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            "2",
            "--max-restarts",
            "1",
            SCRIPT,
            "--out",
            str(tmp_path / "final.pt"),
            "--checkpoint",
            str(tmp_path / "last.ckpt"),
            "--kill-rank",
            "1",
        ],
        timeout=240,
    )
    assert done.returncode == 0, done.output
    assert "exitcode: -9" in done.output  # the first attempt really lost a rank (SIGKILL)
    assert_same(final_weights(tmp_path / "final.pt"), uninterrupted)
