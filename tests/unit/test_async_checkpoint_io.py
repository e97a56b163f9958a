"""``AsyncCheckpointIO`` in one process: Lightning's name and signature, the snapshot, one write at a time, errors
raised at the next save, at load, at ``wait`` and ``teardown``, and which strategies take it."""

from __future__ import annotations

import inspect
import os
import threading
import time
from datetime import timedelta
from typing import Any

import pytest
import torch
from torch import nn

from fabric_lite import Fabric
from fabric_lite.accelerators import CPUAccelerator
from fabric_lite.plugins import AsyncCheckpointIO as FromPlugins
from fabric_lite.plugins.io import AsyncCheckpointIO, CheckpointIO, TorchCheckpointIO
from fabric_lite.runtime.checkpoint import CheckpointError
from fabric_lite.runtime.checkpoint._async import _BackgroundSave
from fabric_lite.runtime.run import RunContext
from fabric_lite.strategies import DDPStrategy


class SlowIO(TorchCheckpointIO):
    def __init__(self, delay: float = 0.3, fail: bool = False) -> None:
        self.delay, self.fail = delay, fail
        self.running = 0
        self.max_running = 0
        self.threads: list[str] = []

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any = None) -> None:
        self.running += 1
        self.max_running = max(self.max_running, self.running)
        self.threads.append(threading.current_thread().name)
        try:
            time.sleep(self.delay)
            if self.fail:
                raise OSError("the disk is full")
            super().save_checkpoint(checkpoint, path, storage_options)
        finally:
            self.running -= 1


def test_lightning_name_and_signature():
    assert FromPlugins is AsyncCheckpointIO and issubclass(AsyncCheckpointIO, CheckpointIO)
    assert list(inspect.signature(AsyncCheckpointIO).parameters) == ["checkpoint_io"]
    assert AsyncCheckpointIO().checkpoint_io is None
    inner = TorchCheckpointIO()
    assert AsyncCheckpointIO(inner).checkpoint_io is inner


def test_refuses_what_is_not_a_checkpoint_io():
    with pytest.raises(TypeError, match="got a str"):
        AsyncCheckpointIO("torch")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="cannot wrap another"):
        AsyncCheckpointIO(AsyncCheckpointIO())


def _fabric(io: CheckpointIO) -> tuple[Fabric, Any, nn.Module]:
    fabric = Fabric(accelerator="cpu", devices=1, plugins=[io])
    model = nn.Linear(8, 8)
    return fabric, fabric.setup(model), model


def test_save_returns_before_the_write_and_holds_the_state_at_the_call(tmp_path):
    io = SlowIO(delay=0.5)
    fabric, fmodel, model = _fabric(AsyncCheckpointIO(io))
    fabric.save(tmp_path / "a.ckpt", {"model": fmodel, "step": 1})  # warm: the first save imports the stager
    fabric.strategy.checkpoint_io.wait()
    expected = model.weight.detach().clone()
    started = time.monotonic()
    fabric.save(tmp_path / "a.ckpt", {"model": fmodel, "step": 2})
    assert time.monotonic() - started < 0.4 and fabric.strategy.checkpoint_io.in_flight
    with torch.no_grad():
        model.weight.add_(1.0)
    loaded = fabric.load(tmp_path / "a.ckpt")  # waits for the write
    assert loaded["step"] == 2 and torch.equal(loaded["model"]["weight"], expected)
    assert io.threads == ["fabric_lite-checkpoint"] * 2


def test_at_most_one_write_in_flight(tmp_path):
    io = SlowIO(delay=0.3)
    plugin = AsyncCheckpointIO(io)
    for step in range(3):
        plugin.save_checkpoint({"step": step}, tmp_path / f"{step}.ckpt")
    plugin.wait()
    assert io.max_running == 1
    assert [torch.load(tmp_path / f"{s}.ckpt")["step"] for s in range(3)] == [0, 1, 2]


def test_a_failed_write_raises_at_the_next_save_and_that_save_is_not_started(tmp_path):
    io = SlowIO(delay=0.0, fail=True)
    plugin = AsyncCheckpointIO(io)
    plugin.save_checkpoint({"step": 1}, tmp_path / "a.ckpt")
    assert plugin._join(30)
    io.fail = False
    with pytest.raises(CheckpointError, match=r"background save to '.*a\.ckpt' failed: OSError: the disk is full"):
        plugin.save_checkpoint({"step": 2}, tmp_path / "b.ckpt")
    plugin.wait()
    assert not (tmp_path / "b.ckpt").exists()
    plugin.save_checkpoint({"step": 3}, tmp_path / "b.ckpt")  # the error was raised once; saving goes on
    assert plugin.load_checkpoint(tmp_path / "b.ckpt")["step"] == 3


@pytest.mark.parametrize("where", ["load", "wait", "teardown", "fabric.load"])
def test_a_failed_write_raises_at(tmp_path, where):
    io = SlowIO(delay=0.1, fail=True)
    plugin = AsyncCheckpointIO(io)
    fabric, fmodel, _ = _fabric(plugin)
    fabric.save(tmp_path / "a.ckpt", {"model": fmodel})
    call = {
        "load": lambda: plugin.load_checkpoint(tmp_path / "a.ckpt"),
        "wait": plugin.wait,
        "teardown": plugin.teardown,
        "fabric.load": lambda: fabric.load(tmp_path / "a.ckpt"),
    }[where]
    with pytest.raises(CheckpointError, match=r"a\.ckpt"):
        call()
    plugin.wait()  # raised once


def test_teardown_waits_and_releases_the_staging_copy(tmp_path):
    plugin = AsyncCheckpointIO(SlowIO(delay=0.2))
    plugin.save_checkpoint({"w": torch.ones(4)}, tmp_path / "a.ckpt")
    assert plugin._stager is not None
    plugin.teardown()
    assert not plugin.in_flight and plugin._stager is None
    assert torch.equal(torch.load(tmp_path / "a.ckpt")["w"], torch.ones(4))


def test_launch_end_waits_for_the_write(tmp_path):
    plugin = AsyncCheckpointIO(SlowIO(delay=0.3))
    fabric = Fabric(accelerator="cpu", devices=1, plugins=[plugin])

    def run(fabric: Fabric) -> None:
        fabric.save(tmp_path / "a.ckpt", {"step": 1})

    fabric.launch(run)
    assert not plugin.in_flight and (tmp_path / "a.ckpt").is_file()


def test_launch_end_raises_a_failed_write(tmp_path):
    fabric = Fabric(accelerator="cpu", devices=1, plugins=[AsyncCheckpointIO(SlowIO(delay=0.1, fail=True))])
    with pytest.raises(CheckpointError, match="the disk is full"):
        fabric.launch(lambda fabric: fabric.save(tmp_path / "a.ckpt", {"step": 1}))


def test_a_training_error_stays_the_error_raised(tmp_path, capsys):
    plugin = AsyncCheckpointIO(SlowIO(delay=0.2, fail=True))
    fabric = Fabric(accelerator="cpu", devices=1, plugins=[plugin])

    def run(fabric: Fabric) -> None:
        fabric.save(tmp_path / "a.ckpt", {"step": 1})
        raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        fabric.launch(run)
    assert not plugin.in_flight
    assert "the disk is full" in capsys.readouterr().err


def test_pickled_plugin_starts_clean(tmp_path):
    import pickle

    plugin = AsyncCheckpointIO()
    plugin.save_checkpoint({"w": torch.ones(2)}, tmp_path / "a.ckpt")
    copy = pickle.loads(pickle.dumps(plugin))
    plugin.wait()
    assert copy._stager is None and not copy.in_flight and isinstance(copy._background, _BackgroundSave)


def test_sharding_strategies_take_only_the_bare_plugin():
    from fabric_lite.strategies import FSDPStrategy, ModelParallelStrategy

    for strategy in (FSDPStrategy(), ModelParallelStrategy(lambda module, mesh: module)):
        with pytest.raises(NotImplementedError, match=r"Pass AsyncCheckpointIO\(\) without a checkpoint_io"):
            strategy.checkpoint_io = AsyncCheckpointIO(TorchCheckpointIO())
        with pytest.raises(NotImplementedError, match="does not support setting a `CheckpointIO` plugin"):
            strategy.checkpoint_io = TorchCheckpointIO()
        bare = AsyncCheckpointIO()
        strategy.checkpoint_io = bare  # the switch to DCP's async_save
        assert strategy._async_io() is bare


def test_deepspeed_refuses_it():
    from fabric_lite.strategies.deepspeed import DeepSpeedStrategy

    with pytest.raises(NotImplementedError, match=r"cannot save through .*AsyncCheckpointIO.*DeepSpeed's engine"):
        DeepSpeedStrategy.checkpoint_io.fset(object.__new__(DeepSpeedStrategy), AsyncCheckpointIO())  # type: ignore[attr-defined]


def test_background_save_describes_the_path():
    background = _BackgroundSave()
    background.submit(lambda: (_ for _ in ()).throw(OSError("no room")), "/ckpt/last.ckpt")
    with pytest.raises(CheckpointError, match=r"The background save to '/ckpt/last.ckpt' failed: OSError: no room"):
        background.wait()
    background.wait()  # once


def test_exit_with_a_failed_write_exits_1(tmp_path):
    from tests.helpers.harness import run_python

    code = (
        "import sys, torch\n"
        "from fabric_lite import Fabric\n"
        "from fabric_lite.plugins.io import AsyncCheckpointIO, TorchCheckpointIO\n"
        "class Failing(TorchCheckpointIO):\n"
        "    def save_checkpoint(self, checkpoint, path, storage_options=None):\n"
        "        raise OSError('the disk is full')\n"
        "fabric = Fabric(accelerator='cpu', devices=1, plugins=[AsyncCheckpointIO(Failing())])\n"
        "fabric.save(sys.argv[1], {'step': 1})\n"
        "print('SCRIPT END', flush=True)\n"
    )
    done = run_python(["-c", code, str(tmp_path / "a.ckpt")], timeout=60)
    assert done.returncode == 1 and "SCRIPT END" in done.stdout, done.output
    assert "the disk is full" in done.stderr and str(tmp_path / "a.ckpt") in done.stderr


def test_after_a_failure_a_rank_announces_its_write_to_the_launcher_and_waits_no_longer_than_its_timeout(
    tmp_path: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """Under a supervising launcher a rank finishing its write after a training error says so in the run folder (the
    launcher then waits before stopping it); a DDP rank waits at most its collectives' timeout, never forever."""
    io = AsyncCheckpointIO()
    strategy = DDPStrategy(accelerator=CPUAccelerator(), checkpoint_io=io, timeout=timedelta(seconds=0.5))
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    strategy.attach_run(RunContext(launcher="spawn", run_dir=str(run_dir)))
    release = threading.Event()
    io._run_in_background(lambda: release.wait(30), tmp_path / "slow.ckpt")
    seen: list[list[str]] = []
    threading.Timer(0.2, lambda: seen.append(sorted(p.name for p in run_dir.iterdir()))).start()
    started = time.monotonic()
    strategy._finish_saves_after_failure()
    waited = time.monotonic() - started
    release.set()
    assert io._join(30)
    assert seen == [[f"saving.{os.getpid()}"]] and list(run_dir.iterdir()) == []  # announced, then withdrawn
    assert 0.5 <= waited < 10, waited
    assert "was not finished within 0 s of the failure" in capsys.readouterr().err
