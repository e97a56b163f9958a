"""``AsyncCheckpointIO``: saving without waiting for the write, on two CPU ranks (issue 25).

* In one job (tests/helpers/jobs/async_checkpoints.py, DDP): the checkpoint is the state at the call; at most one
  write in flight; ``fabric.load`` waits for the write; a failed write raises at the next save and at load on
  both ranks, naming the path.
* FSDP and ModelParallel (sharded folders, DCP's ``async_save``): the same four in one script
  (tests/helpers/scripts/async_save.py).
* Scripts (tests/helpers/scripts/async_save.py, DDP and FSDP; ModelParallel for SIGKILL): the end of
  ``launch(fn)`` and of a script leave a complete checkpoint; a write failing at the end of a script exits 1 with the
  error printed; an error in training during a write leaves the checkpoint complete and the training error reported;
  SIGKILL during the write leaves the previous checkpoint loadable, no partial one visible, and the next save sweeps
  the dead writer's temporary file.

Every job runs under a hard time bound and in its own session, killed whole on timeout.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fabric_lite import Fabric
from fabric_lite.plugins.io import AsyncCheckpointIO
from tests.helpers.harness import REPO, _kill_session, _session_members, base_env, per_rank, run_python

SCRIPT = str(REPO / "tests" / "helpers" / "scripts" / "async_save.py")
SHARDED = ("fsdp", "model_parallel")


@pytest.fixture(scope="module")
def ddp_job(tmp_path_factory):
    from tests.helpers.harness import spawn_job

    folder = tmp_path_factory.mktemp("async_ddp")
    return spawn_job("tests.helpers.jobs.async_checkpoints:observe", 2, timeout=90, folder=str(folder))


@pytest.mark.distributed
def test_ddp_checkpoint_holds_the_state_at_the_call(ddp_job):
    r0, r1 = per_rank(ddp_job, "snapshot")
    assert r0["in_flight_after_save"] is True  # save returned while the write waited
    for r in (r0, r1):
        assert r["changed_meanwhile"] and r["loaded_equals_save_time"], r


@pytest.mark.distributed
def test_ddp_at_most_one_save_in_flight(ddp_job):
    from tests.helpers.jobs.async_checkpoints import SLOW_WRITE

    r0, r1 = per_rank(ddp_job, "at_most_one")
    assert r0["first_call"] < SLOW_WRITE  # the first save did not wait for its write
    assert r0["second_call"] >= SLOW_WRITE * 0.8  # the second waited for the first write
    assert r0["first_write_done_before_second_returned"]
    assert r0["max_running"] == 1 and r0["writes"] == 2
    assert r0["steps"] == r1["steps"] == [1, 2]


@pytest.mark.distributed
def test_ddp_load_waits_for_the_write(ddp_job):
    for r in per_rank(ddp_job, "load_waits"):
        assert r["step"] == 2 and r["leftovers"] == [], r


@pytest.mark.distributed
@pytest.mark.parametrize("check", ["error_at_next_save", "error_at_load"])
def test_ddp_failed_write_raises_on_every_rank(ddp_job, check):
    for r in per_rank(ddp_job, check):
        assert r["error"] == "CheckpointError", r
        assert r["path"] in r["message"] and "disk refused" in r["message"], r
        assert r["after"] == 2.0  # both ranks still in step
        if check == "error_at_next_save":
            assert r["retry_step"] == 3 and not r["next_exists"]


def _script(mode: str, strategy: str, folder: Path, timeout: float = 90):
    return run_python([SCRIPT, mode, strategy, str(folder)], timeout=timeout)


def _load_step(path: Path) -> int:
    fabric = Fabric(accelerator="cpu", devices=1)
    return int(fabric.load(path)["step"])


@pytest.mark.distributed
@pytest.mark.timeout(150)
@pytest.mark.parametrize("strategy", ["fsdp", "model_parallel"])
def test_sharded_semantics(tmp_path, strategy):
    """FSDP and ModelParallel, sharded folders through DCP's async_save: tests 1-4 of the DDP job above, in one
    script."""
    done = _script("checks", strategy, tmp_path)
    assert done.returncode == 0, done.output
    results = [json.loads((tmp_path / f"result{rank}.json").read_text()) for rank in range(2)]
    for r in results:
        assert r["in_flight_after_save"] and r["snapshot"], r
        assert r["first_call"] < 0.5 <= r["second_call"] + 0.1, r  # the second save waited for the first write
        assert r["loaded_steps"] == [1, 2] and r["max_running"] == 1, r
        for where in ("error_at_next_save", "error_at_load"):
            assert r[where].startswith("CheckpointError") and str(tmp_path / "ckpts" / "failing") in r[where], r
            assert "the disk refused the shards" in r[where]
        assert r["leftovers"] == [] and r["published"] == ["first", "second", "snapshot"], r


def _last(folder: Path, strategy: str) -> Path:
    return folder / ("last" if strategy in SHARDED else "last.ckpt")


@pytest.mark.distributed
@pytest.mark.timeout(150)
@pytest.mark.parametrize("strategy", ["ddp", "ddp_spawn", "fsdp"])
def test_end_of_run_waits_for_the_write(tmp_path, strategy):
    """The save returns at once and the run ends right after it: the file is complete once the job has exited."""
    done = _script("end", strategy, tmp_path)
    assert done.returncode == 0, done.output
    assert "SAVE RETURNED rank=0" in done.stdout
    assert _load_step(_last(tmp_path, strategy)) == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == [_last(tmp_path, strategy).name]


@pytest.mark.distributed
@pytest.mark.timeout(150)
@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_failed_write_at_the_end_of_a_script_exits_1(tmp_path, strategy):
    done = _script("exit_error", strategy, tmp_path)
    assert done.returncode == 1, done.output
    assert "no space left on the test's disk" in done.stderr and str(_last(tmp_path, strategy)) in done.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.distributed
@pytest.mark.timeout(150)
@pytest.mark.parametrize("strategy", ["ddp_spawn", "fsdp"])
def test_training_error_during_a_write(tmp_path, strategy):
    done = _script("training_error", strategy, tmp_path)
    assert done.returncode != 0, done.output
    assert "ValueError: training failed while the checkpoint was written" in done.stderr
    assert _load_step(_last(tmp_path, strategy)) == 2  # the write in flight was finished


def _run_until_stalled(folder: Path, strategy: str, timeout: float = 90) -> subprocess.Popen[str]:
    """Start the ``kill`` job and return once its second write has stalled half-way (the job is still alive)."""
    job = subprocess.Popen(
        [sys.executable, SCRIPT, "kill", strategy, str(folder)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=base_env(),
        cwd=REPO,
        start_new_session=True,
    )
    deadline = time.monotonic() + timeout
    assert job.stdout is not None
    seen = ""
    while time.monotonic() < deadline:
        line = job.stdout.readline()
        if not line:
            break
        seen += line
        if "STALLED" in line:
            return job
    _kill_session(job.pid)
    _, err = job.communicate(timeout=30)
    pytest.fail(f"the job never stalled its write:\n{seen}\n{err}")


@pytest.mark.distributed
@pytest.mark.timeout(150)
@pytest.mark.parametrize("strategy", ["ddp", "fsdp", "model_parallel"])
def test_sigkill_during_the_write_keeps_the_previous_checkpoint(tmp_path, strategy):
    job = _run_until_stalled(tmp_path, strategy)
    try:
        temps = [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
        assert len(temps) == 1, "expected the stalled write's temporary file or folder"
        os.killpg(job.pid, signal.SIGKILL)
        job.wait(timeout=30)
    finally:
        _kill_session(job.pid)
        with contextlib.suppress(Exception):
            job.communicate(timeout=30)
    assert not _session_members(job.pid), "processes outlived the killed job"
    path = _last(tmp_path, strategy)
    assert _load_step(path) == 1  # the previous checkpoint, complete (weights_only)
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.endswith(".tmp")) == [path.name]
    if strategy in SHARDED:
        # the next sharded save's temporary folder: the dead writer's is removed first
        from fabric_lite.runtime.checkpoint.folders import make_temp_folder, remove

        remove(make_temp_folder(path))
        assert sorted(p.name for p in tmp_path.iterdir()) == [path.name]
        return
    assert temps[0].stat().st_size > 0, "expected a partial temporary file"
    # the next save (here: of one process, asynchronous too) removes the dead writer's temporary file
    fabric = Fabric(accelerator="cpu", devices=1, plugins=[AsyncCheckpointIO()])
    fabric.save(path, {"step": 3})
    assert fabric.load(path)["step"] == 3
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.ckpt"]
