"""``Fabric.rank_zero_first``: rank 0 runs the block first, the others after it, on real ranks."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.helpers.harness import spawn_job

pytestmark = pytest.mark.distributed


@pytest.mark.parametrize("local", [False, True])
def test_rank_zero_runs_the_block_first(tmp_path, local: bool) -> None:
    results = spawn_job(
        "tests.distributed.test_ordering:rank_zero_first", 3, path=str(tmp_path / "log.txt"), local=local
    )
    for text in results:
        lines = text.split()
        assert lines[0] == "0" and sorted(lines) == ["0", "1", "2"], text


def test_rank_zero_first_on_one_device_just_runs() -> None:
    from fabric_lite import Fabric

    fabric = Fabric(accelerator="cpu", devices=1)
    ran = []
    with fabric.rank_zero_first():
        ran.append(True)
    assert ran == [True]


# ------------------------------------------------- the job: run on every rank by tests/helpers/jobs/_runner.py


def rank_zero_first(fabric, path: str, local: bool) -> str:
    log = Path(path)
    with fabric.rank_zero_first(local=local):
        if fabric.global_rank == 0:
            time.sleep(0.5)  # the others must wait for this, not run alongside it
        with open(log, "a") as f:
            f.write(f"{fabric.global_rank}\n")
    fabric.barrier()
    return log.read_text()
