"""``AsyncCheckpointIO``: saving without waiting for the write, on two CPU ranks (issue 25).

* In one job (``observe``, at the end of this module, DDP): the checkpoint is the state at the call; at most one
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
import threading
import time
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from fabric_lite import Fabric
from fabric_lite.plugins.io import AsyncCheckpointIO, TorchCheckpointIO
from fabric_lite.runtime.checkpoint import CheckpointError
from tests.helpers.harness import FULL_EXIT, REPO, _kill_session, _session_members, base_env, per_rank, run_python
from tests.helpers.jobs.checks import record

SCRIPT = str(REPO / "tests" / "helpers" / "scripts" / "async_save.py")
SHARDED = ("fsdp", "model_parallel")


@pytest.fixture(scope="module")
def ddp_job(tmp_path_factory):
    from tests.helpers.harness import spawn_job

    folder = tmp_path_factory.mktemp("async_ddp")
    return spawn_job("tests.distributed.test_async_checkpoint:observe", 2, timeout=90, folder=str(folder))


@pytest.mark.distributed
def test_ddp_checkpoint_holds_the_state_at_the_call(ddp_job):
    r0, r1 = per_rank(ddp_job, "snapshot")
    assert r0["in_flight_after_save"] is True  # save returned while the write waited
    for r in (r0, r1):
        assert r["changed_meanwhile"] and r["loaded_equals_save_time"], r


@pytest.mark.distributed
def test_ddp_at_most_one_save_in_flight(ddp_job):

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


def _script(mode: str, strategy: str, folder: Path, timeout: float = 90, env: dict[str, str] | None = None):
    return run_python([SCRIPT, mode, strategy, str(folder)], timeout=timeout, env=env)


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
    """The save returns at once and the run ends right after it: the file is complete once the job has exited (the
    interpreter's whole shutdown, as outside the suite)."""
    done = _script("end", strategy, tmp_path, env=base_env(FULL_EXIT))
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


# ------------------------------------------------- the job: run on every rank by tests/helpers/jobs/_runner.py

SLOW_WRITE = 0.5  # seconds a slow write takes


class GatedIO(TorchCheckpointIO):
    """Writes like ``TorchCheckpointIO`` once ``gate`` is set (or after ``delay`` seconds); ``fail`` raises instead.
    Records the largest number of writes that ran at once, and when each write started and ended."""

    def __init__(self, delay: float = 0.0, gated: bool = False, fail: bool = False) -> None:
        self.delay, self.fail = delay, fail
        self.gate = threading.Event()
        if not gated:
            self.gate.set()
        self.running = 0
        self.max_running = 0
        self.spans: list[tuple[float, float]] = []
        self._lock = threading.Lock()

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any = None) -> None:
        with self._lock:
            self.running += 1
            self.max_running = max(self.max_running, self.running)
        started = time.monotonic()
        try:
            self.gate.wait(60)
            time.sleep(self.delay)
            if self.fail:
                raise OSError(f"the disk refused {path}")
            super().save_checkpoint(checkpoint, path, storage_options)
        finally:
            with self._lock:
                self.running -= 1
            self.spans.append((started, time.monotonic()))


def _model(fabric: Any) -> tuple[Any, Any, nn.Module]:
    torch.manual_seed(0)
    model = nn.Linear(16, 4)
    fmodel, foptimizer = fabric.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
    return fmodel, foptimizer, model


def _step(fabric: Any, fmodel: Any, foptimizer: Any) -> None:
    x = torch.arange(32, dtype=torch.float32).reshape(2, 16) / 32 + fabric.global_rank
    fabric.backward(fmodel(x).pow(2).sum())
    foptimizer.step()
    foptimizer.zero_grad()


def _flat(module: nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in module.parameters()]).clone()


def _use(fabric: Any, io: GatedIO) -> AsyncCheckpointIO:
    plugin = AsyncCheckpointIO(io)
    fabric.strategy.checkpoint_io = plugin
    return plugin


def check_snapshot(fabric: Any, folder: str) -> dict[str, Any]:
    """The checkpoint holds the state at the moment of the call: in-place changes and 3 more steps made while the
    write waits do not leak into it."""
    io = GatedIO(gated=True)
    plugin = _use(fabric, io)
    fmodel, foptimizer, model = _model(fabric)
    _step(fabric, fmodel, foptimizer)
    at_save = _flat(model)
    path = Path(folder) / "snapshot.ckpt"
    fabric.save(path, {"model": fmodel, "optimizer": foptimizer, "step": 1})
    in_flight = plugin.in_flight if fabric.global_rank == 0 else None
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    for _ in range(3):
        _step(fabric, fmodel, foptimizer)
    io.gate.set()
    after_steps = _flat(model)
    fabric.load(path, {"model": fmodel, "optimizer": foptimizer})
    return {
        "in_flight_after_save": in_flight,
        "loaded_equals_save_time": torch.equal(_flat(model), at_save),
        "changed_meanwhile": not torch.equal(after_steps, at_save),
    }


def check_at_most_one(fabric: Any, folder: str) -> dict[str, Any]:
    """Two saves back to back: the second call returns only after the first write has finished."""
    io = GatedIO(delay=SLOW_WRITE)
    plugin = _use(fabric, io)
    fmodel, foptimizer, _ = _model(fabric)
    first, second = Path(folder) / "first.ckpt", Path(folder) / "second.ckpt"
    started = time.monotonic()
    fabric.save(first, {"model": fmodel, "step": 1})
    first_call = time.monotonic() - started
    started = time.monotonic()
    fabric.save(second, {"model": fmodel, "step": 2})
    second_returned = time.monotonic()
    second_call = second_returned - started
    plugin.wait()
    fabric.barrier()
    return {
        "first_call": first_call,
        "second_call": second_call,
        "first_write_done_before_second_returned": bool(io.spans) and io.spans[0][1] <= second_returned,
        "max_running": io.max_running,
        "writes": len(io.spans),
        "steps": [torch.load(p, weights_only=True)["step"] for p in (first, second)],
    }


def check_load_waits(fabric: Any, folder: str) -> dict[str, Any]:
    """``fabric.load`` during a slow write returns the new checkpoint, on every rank."""
    io = GatedIO(delay=SLOW_WRITE)
    _use(fabric, io)
    fmodel, foptimizer, _ = _model(fabric)
    path = Path(folder) / "load.ckpt"
    fabric.save(path, {"model": fmodel, "step": 1})
    fabric.barrier()
    fabric.save(path, {"model": fmodel, "step": 2})
    state = {"model": fmodel, "step": 0}
    fabric.load(path, state)
    return {"step": state["step"], "leftovers": sorted(n for n in os.listdir(folder) if n.endswith(".tmp"))}


def _outcome(call: Any) -> dict[str, Any]:
    try:
        call()
    except CheckpointError as err:
        return {"error": "CheckpointError", "message": str(err)}
    except Exception as err:
        return {"error": type(err).__name__, "message": str(err)}
    return {"error": None, "message": ""}


def check_error_at_next_save(fabric: Any, folder: str) -> dict[str, Any]:
    """A failed background write raises at the next save on every rank, naming the path; the save after that works."""
    io = GatedIO(fail=True)
    _use(fabric, io)
    fmodel, _, _ = _model(fabric)
    path = Path(folder) / "failing.ckpt"
    fabric.save(path, {"model": fmodel, "step": 1})  # returns: the write fails in the background
    outcome = _outcome(lambda: fabric.save(Path(folder) / "next.ckpt", {"model": fmodel, "step": 2}))
    outcome["after"] = fabric.all_reduce(torch.tensor(1.0), reduce_op="sum").item()  # still in step
    io.fail = False
    fabric.save(path, {"model": fmodel, "step": 3})
    fabric.strategy._wait_for_saves()
    outcome["retry_step"] = torch.load(path, weights_only=True)["step"]
    outcome["path"] = str(path)
    outcome["next_exists"] = (Path(folder) / "next.ckpt").exists()  # the save that raised was not started
    return outcome


def check_error_at_load(fabric: Any, folder: str) -> dict[str, Any]:
    """A failed background write raises at ``fabric.load`` on every rank, naming the path."""
    io = GatedIO(delay=0.2)
    _use(fabric, io)
    fmodel, _, _ = _model(fabric)
    fabric.save(Path(folder) / "previous.ckpt", {"model": fmodel, "step": 0})
    fabric.strategy._wait_for_saves()
    io.fail = True
    path = Path(folder) / "failing.ckpt"
    fabric.save(path, {"model": fmodel, "step": 1})
    outcome = _outcome(lambda: fabric.load(path, {"model": fmodel}))
    return {**outcome, "path": str(path), "after": fabric.all_reduce(torch.tensor(1.0), reduce_op="sum").item()}


CHECKS = {
    "snapshot": check_snapshot,
    "at_most_one": check_at_most_one,
    "load_waits": check_load_waits,
    "error_at_next_save": check_error_at_next_save,
    "error_at_load": check_error_at_load,
}


def _in_subfolder(fabric: Any, folder: str, name: str) -> Any:
    subfolder = Path(folder) / name
    subfolder.mkdir(parents=True, exist_ok=True)  # by every rank: none writes into it before its own mkdir
    try:
        return CHECKS[name](fabric, str(subfolder))
    finally:
        # each check brings its own IO: the next one starts with no write in flight and no error pending
        io = fabric.strategy._async_io()
        if io is not None:
            io._join(60)
            io._take_error()


def observe(fabric: Any, folder: str) -> dict[str, Any]:
    results = record({name: partial(_in_subfolder, fabric, folder, name) for name in CHECKS})
    fabric.strategy.checkpoint_io = TorchCheckpointIO()
    return results
