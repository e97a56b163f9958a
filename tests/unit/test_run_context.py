"""The run a launcher hands to the strategy (fabric_lite.runtime.run.RunContext), and what a rank finishing a checkpoint
write after a failure tells it through the run folder."""

from __future__ import annotations

import os
import pickle
import tempfile
import threading
import time
from pathlib import Path

import pytest

from fabric_lite.runtime.run import ENV_LAUNCHER, ENV_RUN_DIR, RunContext, announce_save, wait_for_saves
from fabric_lite.strategies import DDPStrategy


def test_a_context_travels_to_a_new_program_through_its_environment() -> None:
    context = RunContext(launcher="script", run_dir="/dev/shm/run", store=object(), local_rank=3)
    environment = context.environment()
    assert environment == {ENV_RUN_DIR: "/dev/shm/run", ENV_LAUNCHER: "script"}  # a store and a rank stay here
    assert RunContext.from_environment(environment) == RunContext(launcher="script", run_dir="/dev/shm/run")


@pytest.mark.parametrize(
    ("environment", "expected"),
    [
        ({}, RunContext()),
        ({ENV_LAUNCHER: "cli", ENV_RUN_DIR: "/tmp/r"}, RunContext(launcher="cli", run_dir="/tmp/r")),
        ({ENV_LAUNCHER: "torchrun", ENV_RUN_DIR: "/tmp/r"}, RunContext(run_dir="/tmp/r")),  # not one of ours
        ({ENV_LAUNCHER: "", ENV_RUN_DIR: ""}, RunContext()),
    ],
)
def test_from_environment(environment: dict[str, str], expected: RunContext) -> None:
    assert RunContext.from_environment(environment) == expected


def test_no_context_without_a_launcher_of_ours_puts_nothing_in_the_environment() -> None:
    assert RunContext().environment() == {}
    assert RunContext(run_dir="/tmp/r").environment() == {}


@pytest.mark.parametrize(
    ("launcher", "supervised", "removes"),
    [("script", True, True), ("spawn", True, True), ("cli", False, True), (None, False, False)],
)
def test_who_supervises_and_who_removes_the_run_folder(launcher: str | None, supervised: bool, removes: bool) -> None:
    context = RunContext(launcher=launcher, run_dir="/tmp/r")  # type: ignore[arg-type]
    assert context.supervised is supervised
    assert context.launcher_removes_run_dir is removes


def test_an_unknown_launcher_is_refused_naming_it() -> None:
    with pytest.raises(ValueError, match=r"RunContext\(launcher='slurm'\) is not one of \('script', 'spawn', 'cli'\)"):
        RunContext(launcher="slurm")  # type: ignore[arg-type]


def test_the_strategy_takes_the_context_and_falls_back_to_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_LAUNCHER, "cli")
    monkeypatch.setenv(ENV_RUN_DIR, "/tmp/from-env")
    strategy = DDPStrategy()
    assert strategy.run_context == RunContext(launcher="cli", run_dir="/tmp/from-env")
    attached = RunContext(launcher="spawn", run_dir="/tmp/attached", local_rank=1)
    strategy.attach_run(attached)
    assert strategy.run_context is attached
    strategy.attach_run(None)
    assert strategy.run_context.run_dir == "/tmp/from-env"
    with pytest.raises(TypeError, match=r"attach_run\('spawn'\): expected a fabric_lite.runtime.run.RunContext"):
        strategy.attach_run("spawn")  # type: ignore[arg-type]


def test_a_spawn_workers_local_rank_comes_from_its_context() -> None:
    strategy = DDPStrategy()
    assert strategy.local_rank == 0  # the environment's (no LOCAL_RANK)
    strategy.attach_run(RunContext(launcher="spawn", run_dir="/tmp/r", local_rank=2))
    assert strategy.local_rank == 2


def test_a_strategy_with_the_launchers_context_pickles_for_its_workers() -> None:
    strategy = DDPStrategy()
    strategy.attach_run(RunContext(launcher="spawn", run_dir="/tmp/r"))
    assert pickle.loads(pickle.dumps(strategy)).run_context == RunContext(launcher="spawn", run_dir="/tmp/r")


# ------------------------------------------------------------------------------ a save finished after a failure
def test_announce_save_marks_the_run_folder_while_the_write_finishes(tmp_path: Path) -> None:
    marker = tmp_path / f"saving.{os.getpid()}"
    with announce_save(str(tmp_path), 30.0):
        assert time.time() < float(marker.read_text()) <= time.time() + 30.0
    assert list(tmp_path.iterdir()) == []
    with announce_save(str(tmp_path), None):
        assert marker.read_text() == "none"
    with announce_save(None, 30.0):  # no launcher to tell
        pass
    assert list(tmp_path.iterdir()) == []


def test_wait_for_saves_waits_for_an_announced_write_and_no_longer() -> None:
    calls: list[float] = []

    def exits_after(n: int):  # type: ignore[no-untyped-def]
        def wait(seconds: float) -> bool:
            calls.append(seconds)
            return len(calls) >= n

        return wait

    with tempfile.TemporaryDirectory() as folder:
        wait_for_saves(folder, {123: exits_after(1)})  # nothing announced: not waited for
        assert calls == []
        (Path(folder) / "saving.123").write_text("none")
        wait_for_saves(folder, {123: exits_after(3)})  # until the process exits
        assert len(calls) == 3 and all(0 < s <= 0.05 for s in calls)
        calls.clear()
        (Path(folder) / "saving.123").write_text(repr(time.time() - 1))  # its deadline has passed
        wait_for_saves(folder, {123: exits_after(100)})
        assert calls == []
        (Path(folder) / "saving.123").write_text(repr(time.time() + 30))
        threading.Timer(0.2, os.unlink, [Path(folder) / "saving.123"]).start()  # the write finished
        started = time.monotonic()
        wait_for_saves(folder, {123: lambda seconds: time.sleep(seconds) or False})
        assert time.monotonic() - started < 5
    wait_for_saves(None, {123: exits_after(1)})
